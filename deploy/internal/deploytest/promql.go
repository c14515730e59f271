package deploytest

import (
	"fmt"
	"slices"
	"strings"
)

// keywords are PromQL words that are not metric names: binary operators,
// modifiers and the float literals.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true,
	"offset": true, "inf": true, "nan": true,
}

// aggregators may be followed by a by/without clause before their
// parenthesized arguments: "sum by (rule) (x)".
var aggregators = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

// groupers take a parenthesized list of label names.
var groupers = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

// MetricNames returns the metric names that expr selects, sorted and
// without duplicates: every identifier that is not a function (followed by
// "("), an aggregation, a keyword, a label name (in braces or in a
// by/without/on/ignoring/group_left/group_right list), a string, a number or
// a duration. It is a tokenizer, not a parser: it reports unbalanced
// brackets and unterminated strings, and leaves the rest of the syntax to
// promtool.
func MetricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			j, err := skipBlock(s, i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipBlock(s, i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			// A number or a duration: 5, 0.99, 1e6, 0x1f, 5m, 1h30m.
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				if (s[i] == 'e' || s[i] == 'E') && i+1 < len(s) && (s[i+1] == '+' || s[i+1] == '-') {
					i++
				}
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r') {
				k++
			}
			lower := strings.ToLower(word)
			switch {
			case groupers[lower]:
				if k < len(s) && s[k] == '(' {
					end, err := skipBlock(s, k, '(', ')')
					if err != nil {
						return nil, err
					}
					j = end
				}
			case keywords[lower] || aggregators[lower]:
			case k < len(s) && s[k] == '(':
				// A function or an aggregation; its arguments are scanned next.
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// skipString returns the index after the string literal that starts at i.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("deploytest: unterminated string in %q", s)
}

// skipBlock returns the index after the block that opens at i, skipping
// strings inside it.
func skipBlock(s string, i int, open, close byte) (int, error) {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("deploytest: unbalanced %q in %q", open, s)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
func isIdent(c byte) bool { return isIdentStart(c) || isDigit(c) }
