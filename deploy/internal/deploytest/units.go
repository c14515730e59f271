package deploytest

import (
	"bufio"
	"fmt"
	"strings"
)

// SystemdUnit is a parsed systemd unit file: each section's settings, in
// order, with repeated keys kept.
type SystemdUnit map[string][]Setting

// Setting is one Key=Value line of a unit (continuation lines joined).
type Setting struct {
	Key, Value string
	Line       int
}

// Values returns the values of key in section, in order.
func (u SystemdUnit) Values(section, key string) []string {
	var vs []string
	for _, s := range u[section] {
		if s.Key == key {
			vs = append(vs, s.Value)
		}
	}
	return vs
}

// Value returns the last value of key in section, and whether it is set.
func (u SystemdUnit) Value(section, key string) (string, bool) {
	vs := u.Values(section, key)
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// ParseUnit parses a unit file as systemd.syntax(7) describes it: sections
// in brackets, Key=Value lines, comments starting with # or ;, and lines
// continued by a trailing backslash.
func ParseUnit(text string) (SystemdUnit, error) {
	u := SystemdUnit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	var cont *Setting
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cont != nil {
			if strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
				continue // comments may interleave continuation lines
			}
			more, goesOn := strings.CutSuffix(line, `\`)
			cont.Value += " " + strings.TrimSpace(more)
			if !goesOn {
				u[section] = append(u[section], *cont)
				cont = nil
			}
			continue
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: bad section header %q", n, line)
			}
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return nil, fmt.Errorf("line %d: not Key=Value in a section: %q", n, line)
			}
			s := Setting{Key: strings.TrimSpace(k), Value: strings.TrimSpace(v), Line: n}
			if more, goesOn := strings.CutSuffix(s.Value, `\`); goesOn {
				s.Value = strings.TrimSpace(more)
				cont = &s
				continue
			}
			u[section] = append(u[section], s)
		}
	}
	if cont != nil {
		return nil, fmt.Errorf("line %d: continuation at end of file", cont.Line)
	}
	return u, sc.Err()
}

// CommandWords splits an Exec*= value into words as systemd does for the
// simple cases: whitespace-separated, with "double" or 'single' quoted
// words, after the optional prefixes -@:+! of the executable.
func CommandWords(value string) ([]string, error) {
	value = strings.TrimLeft(value, "-@:+!")
	var words []string
	var b strings.Builder
	in := false
	var quote byte
	for i := 0; i < len(value); i++ {
		c := value[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				b.WriteByte(c)
			}
		case c == '"' || c == '\'':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", value)
	}
	if in {
		words = append(words, b.String())
	}
	return words, nil
}
