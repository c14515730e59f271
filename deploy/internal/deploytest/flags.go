package deploytest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"strconv"
	"strings"
)

// Flag is one command-line flag as a main.go defines it.
type Flag struct {
	Name string
	// Default is the default value's source text: the unquoted string for
	// a string literal, else the expression as written (e.g. "5 *
	// time.Millisecond", "1 << 20").
	Default string
}

// flagDefiners are the flag.FlagSet methods (and flag package functions)
// that define a flag, with the index of the name argument.
var flagDefiners = map[string]int{
	"Bool": 0, "BoolVar": 1, "BoolFunc": 0,
	"Duration": 0, "DurationVar": 1,
	"Float64": 0, "Float64Var": 1,
	"Func": 0,
	"Int":  0, "IntVar": 1, "Int64": 0, "Int64Var": 1,
	"String": 0, "StringVar": 1,
	"TextVar": 1,
	"Uint":    0, "UintVar": 1, "Uint64": 0, "Uint64Var": 1,
	"Var": 1,
}

// Flags returns the flags that the Go file at path defines with the flag
// package, by name: every call X.Bool(...), X.StringVar(...), ... whose
// name argument is a string literal. It reads the source; it does not
// build or run the command.
func Flags(path string) (map[string]Flag, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	flags := map[string]Flag{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		i, ok := flagDefiners[sel.Sel.Name]
		if !ok || len(call.Args) <= i {
			return true
		}
		lit, ok := call.Args[i].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		fl := Flag{Name: name}
		// The default follows the name, except for Func, BoolFunc and Var,
		// whose Value holds it.
		if d := i + 1; d < len(call.Args) && sel.Sel.Name != "Func" && sel.Sel.Name != "BoolFunc" && sel.Sel.Name != "Var" {
			fl.Default = sourceText(fset, call.Args[d])
		}
		flags[name] = fl
		return true
	})
	if len(flags) == 0 {
		return nil, fmt.Errorf("deploytest: %s defines no flags", path)
	}
	return flags, nil
}

func sourceText(fset *token.FileSet, e ast.Expr) string {
	if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
		if s, err := strconv.Unquote(lit.Value); err == nil {
			return s
		}
	}
	var b strings.Builder
	if err := printer.Fprint(&b, fset, e); err != nil {
		return ""
	}
	return b.String()
}
