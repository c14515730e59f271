package envoyconf

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinels classify every FieldError; check them with errors.Is on the error
// Load returns (a *LoadError, which unwraps to each of its FieldErrors).
var (
	// ErrSyntax: the file is not YAML.
	ErrSyntax = errors.New("invalid YAML")
	// ErrUnknownField: a key envoyproxy/ratelimit does not accept anywhere,
	// or a poplimit extension outside its place.
	ErrUnknownField = errors.New("unknown field")
	// ErrType: a field holds the wrong kind of YAML value.
	ErrType = errors.New("wrong type")
	// ErrInvalid: a field's value is out of its range or set.
	ErrInvalid = errors.New("invalid value")
	// ErrDuplicateDomain: a domain defined by two files.
	ErrDuplicateDomain = errors.New("duplicate domain")
	// ErrDuplicateDescriptor: two descriptors of one list with the same
	// composite key ("key" or "key_value").
	ErrDuplicateDescriptor = errors.New("duplicate descriptor")
	// ErrTooLarge: a file over Loader.MaxFileBytes, or whose aliases expand
	// beyond Loader.MaxNodes.
	ErrTooLarge = errors.New("too large")
)

// FieldError is one problem at one place of one file.
type FieldError struct {
	File   string // the name the file was given to Load or Parse
	Line   int    // 1-based line of the offending node; 0 when unknown
	Column int    // 1-based column; 0 when unknown
	// Path names the field from the file's root, as
	// "descriptors[1].descriptors[0].rate_limit.unit"; empty for the whole file.
	Path   string
	Reason string // what is wrong, without the place
	Err    error  // one of the sentinels above
}

// Error formats the error as "file:line:col: path: reason".
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns the sentinel that classifies the error.
func (e *FieldError) Unwrap() error { return e.Err }

// maxErrors bounds the errors one Load keeps; the rest are counted.
const maxErrors = 100

// LoadError is what Load and Parse return for a bad set of files: every
// problem found, by file name, then by line and column. No Config is
// produced when there is any.
type LoadError struct {
	Errors  []*FieldError
	Omitted int // problems found beyond the first 100, not kept
}

// Error lists every problem, one a line.
func (e *LoadError) Error() string {
	if len(e.Errors) == 1 && e.Omitted == 0 {
		return "envoyconf: " + e.Errors[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "envoyconf: %d errors:", len(e.Errors)+e.Omitted)
	for _, fe := range e.Errors {
		b.WriteString("\n\t")
		b.WriteString(fe.Error())
	}
	if e.Omitted > 0 {
		fmt.Fprintf(&b, "\n\t(and %d more)", e.Omitted)
	}
	return b.String()
}

// Unwrap returns the FieldErrors, so errors.Is finds any sentinel among them.
func (e *LoadError) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, fe := range e.Errors {
		errs[i] = fe
	}
	return errs
}

// problems collects the errors and warnings of one Load.
type problems struct {
	errs     []*FieldError
	omitted  int
	warnings []string
}

func (p *problems) add(fe *FieldError) {
	if len(p.errs) >= maxErrors {
		p.omitted++
		return
	}
	p.errs = append(p.errs, fe)
}

func (p *problems) warn(fe *FieldError) {
	if len(p.warnings) >= maxErrors {
		return
	}
	p.warnings = append(p.warnings, fe.Error())
}

func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return &LoadError{Errors: p.errs, Omitted: p.omitted}
}
