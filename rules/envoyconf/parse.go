package envoyconf

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	yaml "go.yaml.in/yaml/v3"
)

// validKeys are the keys envoyproxy/ratelimit accepts anywhere in a file
// (src/config/config_impl.go validKeys): it rejects a file with any other
// key, but ignores a known key in a place where it means nothing.
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true,
	"rate_limit": true, "unit": true, "requests_per_unit": true,
	"unlimited": true, "shadow_mode": true, "quota_mode": true,
	"name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
}

// extensionKeys are poplimit's keys inside a rate_limit block.
var extensionKeys = map[string]bool{
	"algorithm": true, "window": true, "burst": true, "mode": true,
	"action": true, "timeout": true, "fail": true, "count": true,
}

// maxWindow bounds the window and timeout extensions.
const maxWindow = 366 * 24 * time.Hour

// fileDefaults is a file's top-level poplimit block: the extension values
// of its limits that do not set their own.
type fileDefaults struct {
	algorithm policy.Algorithm
	mode      policy.Mode
	action    policy.Action
	count     bool // action "count": policy.Block without a timeout
	fail      policy.Fail
}

// envoyDefaults are the defaults of a file without a poplimit block:
// envoyproxy/ratelimit's behaviour (see Limit).
var envoyDefaults = fileDefaults{algorithm: policy.FixedWindow, mode: policy.Sync,
	action: policy.Block, count: true, fail: policy.FailOpen}

// fileParser walks one file's YAML nodes. It reads the YAML as
// envoyproxy/ratelimit's parser (gopkg.in/yaml.v2, YAML 1.1 scalars) reads
// it where the two differ in ways a config file can show: merge keys (<<)
// are applied in order, a later key replacing an earlier one, and a key
// written twice keeps its last value; yes/no/on/off are booleans.
type fileParser struct {
	name   string
	loader *Loader
	cfg    *Config
	probs  *problems

	budget    int // node visits left
	exhausted bool
	active    map[*yaml.Node]bool // alias targets being expanded: a second entry is a cycle

	defaults fileDefaults
	domain   string
}

// field is one key of a mapping as the decoder sees it.
type field struct {
	name   string
	key    *yaml.Node
	val    *yaml.Node
	merged bool // came from a merge key (<<)
}

func (p *fileParser) fail(n *yaml.Node, path string, sentinel error, format string, args ...any) {
	fe := &FieldError{File: p.name, Path: path, Reason: fmt.Sprintf(format, args...), Err: sentinel}
	if n != nil {
		fe.Line, fe.Column = n.Line, n.Column
	}
	p.probs.add(fe)
}

func (p *fileParser) warn(n *yaml.Node, path string, format string, args ...any) {
	fe := &FieldError{File: p.name, Path: path, Reason: fmt.Sprintf(format, args...)}
	if n != nil {
		fe.Line, fe.Column = n.Line, n.Column
	}
	p.probs.warn(fe)
}

// parseFile loads one file into p.cfg, reporting every problem, in the
// order of their places in the file.
func (p *fileParser) parseFile(data []byte) {
	start := len(p.probs.errs)
	defer func() {
		errs := p.probs.errs[start:]
		sort.SliceStable(errs, func(i, j int) bool {
			if errs[i].Line != errs[j].Line {
				return errs[i].Line < errs[j].Line
			}
			return errs[i].Column < errs[j].Column
		})
	}()
	defer func() {
		// The walker is written not to panic; this keeps Load's promise if
		// the YAML library ever does.
		if r := recover(); r != nil {
			p.fail(nil, "", ErrSyntax, "cannot read the file: %v", r)
		}
	}()
	if len(data) > p.loader.MaxFileBytes {
		p.fail(nil, "", ErrTooLarge, "the file is %d bytes, over the %d-byte bound", len(data), p.loader.MaxFileBytes)
		return
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	err := dec.Decode(&doc)
	switch {
	case errors.Is(err, io.EOF):
		// An empty file: no domain, reported below.
	case err != nil:
		line, reason := syntaxPosition(err)
		p.probs.add(&FieldError{File: p.name, Line: line, Reason: reason, Err: ErrSyntax})
		return
	}
	var root *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	p.parseRoot(root)
	if err == nil {
		var next yaml.Node
		if dec.Decode(&next) == nil {
			p.warn(&next, "", "only the first YAML document of a file is read (as ratelimit reads it)")
		}
	}
}

// syntaxPosition splits the YAML library's "yaml: line N: reason".
func syntaxPosition(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				return n, "invalid YAML: " + strings.TrimSpace(rest[i+1:])
			}
		}
	}
	return 0, "invalid YAML: " + msg
}

// enter accounts for a visit of n and follows it if it is an alias. It
// returns nil when n is nil, the node budget is spent, or the alias is part
// of a cycle; leave must be called with the same n when ok.
func (p *fileParser) enter(n *yaml.Node, path string) (t *yaml.Node, ok bool) {
	if n == nil || p.exhausted {
		return nil, false
	}
	p.budget--
	if p.budget < 0 {
		p.exhausted = true
		p.fail(n, path, ErrTooLarge, "the file's aliases expand beyond %d YAML nodes", p.loader.MaxNodes)
		return nil, false
	}
	if n.Kind != yaml.AliasNode {
		return n, true
	}
	t = n.Alias
	if t == nil {
		p.fail(n, path, ErrSyntax, "unknown alias *%s", n.Value)
		return nil, false
	}
	if p.active == nil {
		p.active = make(map[*yaml.Node]bool)
	}
	if p.active[t] {
		p.fail(n, path, ErrSyntax, "alias *%s contains itself", n.Value)
		return nil, false
	}
	p.active[t] = true
	return t, true
}

func (p *fileParser) leave(n *yaml.Node) {
	if n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		delete(p.active, n.Alias)
	}
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func isMerge(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Value == "<<" && n.ShortTag() == "!!merge"
}

// kindName names a node's kind in errors.
func kindName(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "a boolean"
		case "!!int":
			return "an integer"
		case "!!float":
			return "a float"
		}
		return fmt.Sprintf("the string %q", clip(n.Value))
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// fields returns a mapping's keys as ratelimit's decoder sees them: merge
// keys expanded in place (a sequence of mappings merged last to first, so
// the first wins), a key written again replacing the earlier value. With
// anyKey, keys may be any scalar (metadata); otherwise they must be strings.
func (p *fileParser) fields(m *yaml.Node, path string, anyKey bool) []field {
	var fs fieldSet
	p.collect(m, path, anyKey, true, &fs)
	return fs.list
}

// fieldSet is the keys of one mapping in first-seen order, indexed by name.
type fieldSet struct {
	list  []field
	index map[string]int
}

func (fs *fieldSet) find(name string) (int, bool) {
	i, ok := fs.index[name]
	return i, ok
}

func (fs *fieldSet) add(f field) {
	if fs.index == nil {
		fs.index = make(map[string]int)
	}
	fs.index[f.name] = len(fs.list)
	fs.list = append(fs.list, f)
}

func (p *fileParser) collect(m *yaml.Node, path string, anyKey, explicit bool, out *fieldSet) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		kt, ok := p.enter(k, path)
		if !ok {
			return
		}
		p.leave(k)
		if isMerge(kt) {
			p.merge(v, path, anyKey, out)
			continue
		}
		if kt.Kind != yaml.ScalarNode {
			p.fail(k, path, ErrType, "a mapping key must be a string (got %s)", kindName(kt))
			continue
		}
		if !anyKey && kt.ShortTag() != "!!str" {
			p.fail(k, path, ErrType, "key %s is not a string", kindName(kt))
			continue
		}
		f := field{name: kt.Value, key: k, val: v, merged: !explicit}
		if j, ok := out.find(f.name); ok {
			if explicit && !out.list[j].merged {
				p.warn(k, join(path, f.name), "written twice in one mapping; the last one counts (as in ratelimit)")
			}
			out.list[j] = f
		} else {
			out.add(f)
		}
	}
}

func (p *fileParser) merge(v *yaml.Node, path string, anyKey bool, out *fieldSet) {
	t, ok := p.enter(v, path)
	if !ok {
		return
	}
	defer p.leave(v)
	switch t.Kind {
	case yaml.MappingNode:
		p.collect(t, path, anyKey, false, out)
	case yaml.SequenceNode:
		for i := len(t.Content) - 1; i >= 0; i-- {
			e := t.Content[i]
			et, ok := p.enter(e, path)
			if !ok {
				return
			}
			if et.Kind == yaml.MappingNode {
				p.collect(et, path, anyKey, false, out)
			} else {
				p.fail(e, path, ErrType, "a merge (<<) takes a mapping or a list of mappings (got %s)", kindName(et))
			}
			p.leave(e)
		}
	default:
		p.fail(v, path, ErrType, "a merge (<<) takes a mapping or a list of mappings (got %s)", kindName(t))
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// ignored handles a key ratelimit knows but does not use where it is: it is
// ignored, as ratelimit ignores it, after the same checks ratelimit makes of
// any key's value.
func (p *fileParser) ignored(f field, path string) {
	p.warn(f.key, path, "ratelimit accepts %q here but it has no effect; ignored", f.name)
	p.loose(f.val, path)
}

// unknown reports a key ratelimit rejects.
func (p *fileParser) unknown(f field, path, where string) {
	hint := ""
	switch {
	case extensionKeys[f.name] && where != "rate_limit":
		hint = " (poplimit's " + f.name + " goes inside rate_limit)"
	case f.name == "poplimit" && where != "root":
		hint = " (the poplimit block goes at the top of the file)"
	}
	p.fail(f.key, path, ErrUnknownField, "unknown field %q%s", clip(f.name), hint)
}

// loose checks a value nothing reads as ratelimit checks every value: keys
// must be ones it knows (metadata's are free), lists must hold mappings,
// and scalars must not be floats or integers beyond 64 bits.
func (p *fileParser) loose(n *yaml.Node, path string) {
	t, ok := p.enter(n, path)
	if !ok {
		return
	}
	defer p.leave(n)
	switch t.Kind {
	case yaml.MappingNode:
		for _, f := range p.fields(t, path, false) {
			fp := join(path, f.name)
			switch {
			case !validKeys[f.name]:
				p.unknown(f, fp, "")
			case f.name == "metadata":
			default:
				p.loose(f.val, fp)
			}
		}
	case yaml.SequenceNode:
		for i, e := range t.Content {
			et, ok := p.enter(e, index(path, i))
			if !ok {
				return
			}
			if et.Kind == yaml.MappingNode {
				p.loose(e, index(path, i))
			} else {
				p.fail(e, index(path, i), ErrType, "ratelimit accepts lists of mappings only (got %s)", kindName(et))
			}
			p.leave(e)
		}
	case yaml.ScalarNode:
		p.leaf(t, path)
	}
}

// leaf reports the scalars ratelimit's key check rejects anywhere outside
// metadata: floats, and integers that do not fit 64 bits.
func (p *fileParser) leaf(t *yaml.Node, path string) bool {
	switch t.ShortTag() {
	case "!!float":
		p.fail(t, path, ErrType, "a float (%s) is not accepted here (ratelimit rejects floats)", clip(t.Value))
		return false
	case "!!int":
		var v int64
		if t.Decode(&v) != nil {
			p.fail(t, path, ErrInvalid, "integer %s is out of range (ratelimit rejects integers beyond int64)", clip(t.Value))
			return false
		}
	}
	return true
}

// str reads a string field. Integers, booleans and timestamps are read as
// written ("10", "yes"), null as "", as ratelimit's decoder reads them.
func (p *fileParser) str(f field, path string) (string, bool) {
	t, ok := p.enter(f.val, path)
	if !ok {
		return "", false
	}
	defer p.leave(f.val)
	if t.Kind != yaml.ScalarNode {
		p.fail(f.val, path, ErrType, "must be a string (got %s)", kindName(t))
		return "", false
	}
	switch t.ShortTag() {
	case "!!null":
		return "", true
	case "!!binary":
		b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(t.Value), ""))
		if err != nil {
			p.fail(f.val, path, ErrInvalid, "invalid !!binary value: %v", err)
			return "", false
		}
		return string(b), true
	}
	if !p.leaf(t, path) {
		return "", false
	}
	return t.Value, true
}

// yaml11Bools are the plain scalars YAML 1.1 (ratelimit's parser) reads as
// booleans beyond true and false.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// boolean reads a boolean field; null is false.
func (p *fileParser) boolean(f field, path string) (bool, bool) {
	t, ok := p.enter(f.val, path)
	if !ok {
		return false, false
	}
	defer p.leave(f.val)
	if v, ok := scalarBool(t); ok {
		return v, true
	}
	if isNull(t) {
		return false, true
	}
	p.fail(f.val, path, ErrType, "must be true or false (got %s)", kindName(t))
	return false, false
}

func scalarBool(t *yaml.Node) (bool, bool) {
	if t.Kind != yaml.ScalarNode {
		return false, false
	}
	if t.ShortTag() == "!!bool" {
		v, err := strconv.ParseBool(strings.ToLower(t.Value))
		return v, err == nil
	}
	if t.Style == 0 && t.Tag == "!!str" {
		v, ok := yaml11Bools[t.Value]
		return v, ok
	}
	return false, false
}

// unsigned reads an integer field within [lo, hi]; null is 0.
func (p *fileParser) unsigned(f field, path string, lo, hi uint64) (uint64, bool) {
	t, ok := p.enter(f.val, path)
	if !ok {
		return 0, false
	}
	defer p.leave(f.val)
	if isNull(t) && lo == 0 {
		return 0, true
	}
	if t.Kind != yaml.ScalarNode || t.ShortTag() != "!!int" {
		p.fail(f.val, path, ErrType, "must be an integer (got %s)", kindName(t))
		return 0, false
	}
	var v uint64
	if t.Decode(&v) != nil || v < lo || v > hi {
		p.fail(f.val, path, ErrInvalid, "must be between %d and %d (got %s)", lo, hi, clip(t.Value))
		return 0, false
	}
	return v, true
}

// enum reads one of names.
func (p *fileParser) enum(f field, path string, names []string) (int, bool) {
	s, ok := p.str(f, path)
	if !ok {
		return 0, false
	}
	i, ok := enumIndex(names, s)
	if !ok {
		p.fail(f.val, path, ErrInvalid, "unknown %s %q (want %s)", f.name, clip(s), orList(names))
		return 0, false
	}
	return i, true
}

func orList(names []string) string {
	switch len(names) {
	case 1:
		return names[0]
	case 2:
		return names[0] + " or " + names[1]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// duration reads a window or timeout: a Go duration ("90s", "1m30s") with
// an optional leading whole number of days ("1d", "2d12h"), in whole
// milliseconds, from 1 ms to 366 days.
func (p *fileParser) duration(f field, path string) (time.Duration, bool) {
	s, ok := p.str(f, path)
	if !ok {
		return 0, false
	}
	d, err := parseDuration(s)
	if err != nil {
		p.fail(f.val, path, ErrInvalid, "%v", err)
		return 0, false
	}
	return d, true
}

func parseDuration(s string) (time.Duration, error) {
	var days time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.ParseUint(s[:i], 10, 16)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (want e.g. \"90s\", \"1m\", \"1d\")", clip(s))
		}
		days = time.Duration(n) * 24 * time.Hour
		rest = s[i+1:]
	}
	var d time.Duration
	if rest != "" {
		var err error
		if d, err = time.ParseDuration(rest); err != nil {
			return 0, fmt.Errorf("invalid duration %q (want e.g. \"90s\", \"1m\", \"1d\")", clip(s))
		}
	} else if days == 0 {
		return 0, fmt.Errorf("invalid duration %q (want e.g. \"90s\", \"1m\", \"1d\")", clip(s))
	}
	if d < 0 || d > maxWindow {
		return 0, fmt.Errorf("must be between 1ms and 366d (got %q)", clip(s))
	}
	d += days
	switch {
	case d < time.Millisecond || d > maxWindow:
		return 0, fmt.Errorf("must be between 1ms and 366d (got %q)", clip(s))
	case d%time.Millisecond != 0:
		return 0, fmt.Errorf("must be whole milliseconds (got %q)", clip(s))
	}
	return d, nil
}

// parseRoot reads the file's top mapping: domain, descriptors, poplimit.
func (p *fileParser) parseRoot(n *yaml.Node) {
	var fields []field
	t, ok := p.enter(n, "")
	if n != nil && !ok {
		return
	}
	if ok {
		defer p.leave(n)
		switch {
		case isNull(t):
		case t.Kind != yaml.MappingNode:
			p.fail(t, "", ErrType, "the file must be a mapping with domain and descriptors (got %s)", kindName(t))
			return
		default:
			fields = p.fields(t, "", false)
		}
	}
	var domF, descF *field
	for i := range fields {
		f := fields[i]
		switch f.name {
		case "domain":
			domF = &fields[i]
		case "descriptors":
			descF = &fields[i]
		case "poplimit":
			p.parseDefaults(f, "poplimit")
		default:
			if validKeys[f.name] {
				p.ignored(f, f.name)
			} else {
				p.unknown(f, f.name, "root")
			}
		}
	}

	dt := &domainTree{file: p.name, defaults: p.defaults}
	domainOK := true
	if domF != nil {
		p.domain, domainOK = p.str(*domF, "domain")
	}
	switch {
	case p.domain == "" && !domainOK:
		// Already reported: not a string.
	case p.domain == "":
		at := t
		if domF != nil {
			at = domF.val
		}
		p.fail(at, "domain", ErrInvalid, "config file cannot have empty domain")
	case p.cfg.domains[p.domain] != nil && !p.loader.MergeDomains:
		p.fail(domF.val, "domain", ErrDuplicateDomain, "duplicate domain '%s' in config file (also in %s)", clip(p.domain), p.cfg.domains[p.domain].file)
	case p.cfg.domains[p.domain] != nil:
		dt = p.cfg.domains[p.domain]
	default:
		dt.name = p.domain
		p.cfg.domains[p.domain] = dt
	}
	if descF != nil {
		p.descriptorList(*descF, "descriptors", &dt.root, p.domain+".")
	}
}

// parseDefaults reads the top-level poplimit block.
func (p *fileParser) parseDefaults(f field, path string) {
	t, ok := p.enter(f.val, path)
	if !ok {
		return
	}
	defer p.leave(f.val)
	if isNull(t) {
		return
	}
	if t.Kind != yaml.MappingNode {
		p.fail(f.val, path, ErrType, "must be a mapping of algorithm, mode, action, fail (got %s)", kindName(t))
		return
	}
	for _, g := range p.fields(t, path, false) {
		gp := join(path, g.name)
		switch g.name {
		case "algorithm":
			if i, ok := p.enum(g, gp, policy.Names[policy.Algorithm]()); ok {
				p.defaults.algorithm = policy.Algorithm(i)
			}
		case "mode":
			if i, ok := p.enum(g, gp, policy.Names[policy.Mode]()); ok {
				p.defaults.mode = policy.Mode(i)
			}
		case "action":
			if i, ok := p.enum(g, gp, actionNames); ok {
				p.defaults.action, p.defaults.count = actionOf(i)
			}
		case "fail":
			if i, ok := p.enum(g, gp, policy.Names[policy.Fail]()); ok {
				p.defaults.fail = policy.Fail(i)
			}
		default:
			p.fail(g.key, gp, ErrUnknownField, "unknown field %q (the poplimit block takes algorithm, mode, action, fail)", clip(g.name))
		}
	}
}

// descriptorList reads a descriptors list into parent.
func (p *fileParser) descriptorList(f field, path string, parent *node, parentKey string) {
	t, ok := p.enter(f.val, path)
	if !ok {
		return
	}
	defer p.leave(f.val)
	if isNull(t) {
		return
	}
	if t.Kind != yaml.SequenceNode {
		p.fail(f.val, path, ErrType, "must be a list of descriptors (got %s)", kindName(t))
		return
	}
	for i, e := range t.Content {
		p.descriptor(e, index(path, i), parent, parentKey)
	}
}

// descriptor reads one descriptor into parent, as ratelimit's
// loadDescriptors does.
func (p *fileParser) descriptor(n *yaml.Node, path string, parent *node, parentKey string) {
	t, ok := p.enter(n, path)
	if !ok {
		return
	}
	defer p.leave(n)
	if t.Kind != yaml.MappingNode {
		p.fail(n, path, ErrType, "a descriptor must be a mapping (got %s)", kindName(t))
		return
	}
	var (
		key, value              string
		keyF, rlF, descF, metaF *field
		shadow, quota, detailed bool
		valueToMetric, share    bool
		shareF                  *field
		fields                  = p.fields(t, path, false)
	)
	for i := range fields {
		f := fields[i]
		fp := join(path, f.name)
		switch f.name {
		case "key":
			keyF = &fields[i]
			key, _ = p.str(f, fp)
		case "value":
			value, _ = p.str(f, fp)
		case "rate_limit":
			rlF = &fields[i]
		case "descriptors":
			descF = &fields[i]
		case "metadata":
			metaF = &fields[i]
		case "shadow_mode":
			shadow, _ = p.boolean(f, fp)
		case "quota_mode":
			quota, _ = p.boolean(f, fp)
		case "detailed_metric":
			detailed, _ = p.boolean(f, fp)
		case "value_to_metric":
			valueToMetric, _ = p.boolean(f, fp)
		case "share_threshold":
			shareF = &fields[i]
			share, _ = p.boolean(f, fp)
		default:
			if validKeys[f.name] {
				p.ignored(f, fp)
			} else {
				p.unknown(f, fp, "descriptor")
			}
		}
	}

	// The composite key: "key", or "key_value" when a value is given.
	finalKey := key
	if value != "" {
		finalKey += "_" + value
	}
	fullKey := parentKey + finalKey
	insert := true
	if key == "" {
		at := t
		if keyF != nil {
			at = keyF.val
		}
		p.fail(at, join(path, "key"), ErrInvalid, "descriptor has empty key")
		insert = false
	} else if dup := parent.children[finalKey]; dup != nil {
		p.fail(t, path, ErrDuplicateDescriptor, "duplicate descriptor composite key '%s' (first at line %d)", clip(fullKey), dup.line)
		insert = false
	}
	wild := strings.Contains(finalKey, "*")
	if share && !wild {
		p.fail(shareF.val, join(path, "share_threshold"), ErrInvalid,
			"share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", clip(finalKey))
	}

	nd := &node{finalKey: finalKey, valueToMetric: valueToMetric, share: share && wild, line: t.Line}
	if rlF != nil {
		nd.limit = p.rateLimit(*rlF, join(path, "rate_limit"), fullKey, shadow, quota, detailed)
	}
	if metaF != nil {
		md := p.metadata(*metaF, join(path, "metadata"))
		if nd.limit != nil {
			nd.limit.Metadata = md
		}
	}
	if nd.limit != nil {
		p.cfg.limits = append(p.cfg.limits, nd.limit)
	}
	if insert {
		if parent.children == nil {
			parent.children = make(map[string]*node)
		}
		parent.children[finalKey] = nd
		if wild {
			parent.wild = append(parent.wild, newWildcard(finalKey, nd))
		}
	}
	if descF != nil {
		p.descriptorList(*descF, join(path, "descriptors"), nd, fullKey+".")
	}
}

// rateLimit reads a rate_limit block; nil when the block is null.
func (p *fileParser) rateLimit(f field, path, fullKey string, shadow, quota, detailed bool) *Limit {
	t, ok := p.enter(f.val, path)
	if !ok {
		return nil
	}
	defer p.leave(f.val)
	if isNull(t) {
		return nil
	}
	if t.Kind != yaml.MappingNode {
		p.fail(f.val, path, ErrType, "must be a mapping (got %s)", kindName(t))
		return nil
	}
	l := &Limit{
		Domain: p.domain, FullKey: fullKey, File: p.name, Line: t.Line,
		ShadowMode: shadow, QuotaMode: quota, DetailedMetric: detailed,
		Algorithm: p.defaults.algorithm, Mode: p.defaults.mode,
		Action: p.defaults.action, Fail: p.defaults.fail,
	}
	count := p.defaults.count
	var (
		unitStr           string
		unitF, rpuF, winF *field
		burstF, timeoutF  *field
		replacesF         *field
		extSet            []field
		window            time.Duration
		windowOK          = true
		fields            = p.fields(t, path, false)
	)
	for i := range fields {
		g := fields[i]
		gp := join(path, g.name)
		switch g.name {
		case "requests_per_unit":
			rpuF = &fields[i]
			v, _ := p.unsigned(g, gp, 0, math.MaxUint32)
			l.RequestsPerUnit = uint32(v)
		case "unit":
			unitF = &fields[i]
			unitStr, _ = p.str(g, gp)
		case "unlimited":
			l.Unlimited, _ = p.boolean(g, gp)
		case "name":
			l.Name, _ = p.str(g, gp)
		case "replaces":
			replacesF = &fields[i]
		case "algorithm":
			extSet = append(extSet, g)
			if i, ok := p.enum(g, gp, policy.Names[policy.Algorithm]()); ok {
				l.Algorithm = policy.Algorithm(i)
			}
		case "mode":
			extSet = append(extSet, g)
			if i, ok := p.enum(g, gp, policy.Names[policy.Mode]()); ok {
				l.Mode = policy.Mode(i)
			}
		case "action":
			extSet = append(extSet, g)
			if i, ok := p.enum(g, gp, actionNames); ok {
				l.Action, count = actionOf(i)
			}
		case "fail":
			extSet = append(extSet, g)
			if i, ok := p.enum(g, gp, policy.Names[policy.Fail]()); ok {
				l.Fail = policy.Fail(i)
			}
		case "window":
			extSet = append(extSet, g)
			winF = &fields[i]
			window, windowOK = p.duration(g, gp)
		case "burst":
			extSet = append(extSet, g)
			burstF = &fields[i]
			l.Burst, _ = p.unsigned(g, gp, 1, math.MaxUint32)
		case "timeout":
			extSet = append(extSet, g)
			timeoutF = &fields[i]
			l.Timeout, _ = p.duration(g, gp)
		case "count":
			extSet = append(extSet, g)
			l.Count = p.count(g, gp)
		default:
			if validKeys[g.name] {
				p.ignored(g, gp)
			} else {
				p.unknown(g, gp, "rate_limit")
			}
		}
	}
	if replacesF != nil {
		l.Replaces = p.replaces(*replacesF, join(path, "replaces"), l.Name)
	}

	unit, validUnit := ParseUnit(unitStr)
	switch {
	case l.Unlimited:
		// ratelimit refuses a valid unit on an unlimited limit, and
		// ignores an invalid one.
		if validUnit {
			p.fail(unitF.val, join(path, "unit"), ErrInvalid, "should not specify rate limit unit when unlimited")
		} else if unitStr != "" {
			p.warn(unitF.val, join(path, "unit"), "unit %q is ignored on an unlimited limit (as in ratelimit)", clip(unitStr))
		}
		for _, g := range extSet {
			p.fail(g.key, join(path, g.name), ErrInvalid, "has no effect on an unlimited limit")
		}
		l.Algorithm, l.Mode, l.Action, l.Fail = envoyDefaults.algorithm, envoyDefaults.mode, envoyDefaults.action, envoyDefaults.fail
		return l
	case winF != nil:
		if unitStr != "" {
			p.fail(winF.key, join(path, "window"), ErrInvalid, "set either unit or window, not both (unit is %q)", clip(unitStr))
		}
		if windowOK {
			l.Window = window
			l.Unit = unitOf(window)
		}
	case !validUnit:
		at := t
		if unitF != nil {
			at = unitF.val
		}
		p.fail(at, join(path, "unit"), ErrInvalid, "invalid rate limit unit '%s' (want second, minute, hour, day, week, month or year)", clip(unitStr))
	default:
		l.Unit = unit
		l.Window = time.Duration(unit.Seconds()) * time.Second
	}
	if rpuF == nil {
		p.warn(t, join(path, "requests_per_unit"), "missing: the limit is 0 requests and refuses every request (as in ratelimit)")
	}
	if burstF != nil && !l.Algorithm.IsBucket() {
		p.fail(burstF.key, join(path, "burst"), ErrInvalid, "applies to token_bucket and leaky_bucket only (algorithm is %s)", l.Algorithm)
	}
	if l.Algorithm.IsBucket() && l.Burst == 0 {
		l.Burst = uint64(l.RequestsPerUnit)
	}
	if timeoutF != nil && (l.Action != policy.Block || count) {
		action := l.Action.String()
		if count {
			action = "count"
		}
		p.fail(timeoutF.key, join(path, "timeout"), ErrInvalid, "applies to action block only (action is %s)", action)
	}
	if l.Action == policy.Block && !count && l.Timeout == 0 {
		l.Timeout = l.Window
	}
	return l
}

// count reads the count extension: {status: [codes or classes],
// cost_header: name}, as a poplimit rules file writes it.
func (p *fileParser) count(f field, path string) rules.Count {
	if f.val.Kind != yaml.MappingNode {
		p.fail(f.val, path, ErrInvalid, "must be a mapping of status and cost_header")
		return rules.Count{}
	}
	var cy struct {
		Status     *[]string `yaml:"status"`
		CostHeader string    `yaml:"cost_header"`
	}
	for i := 0; i+1 < len(f.val.Content); i += 2 {
		if k := f.val.Content[i].Value; k != "status" && k != "cost_header" {
			p.fail(f.val.Content[i], join(path, k), ErrInvalid, "unknown key: count takes status and cost_header")
			return rules.Count{}
		}
	}
	if err := f.val.Decode(&cy); err != nil {
		p.fail(f.val, path, ErrInvalid, "must be a mapping of status (a list) and cost_header (a header name)")
		return rules.Count{}
	}
	c, err := rules.NewCount(cy.Status, cy.CostHeader)
	if err != nil {
		p.fail(f.val, path, ErrInvalid, "%v", err)
		return rules.Count{}
	}
	return c
}

// replaces reads rate_limit.replaces: a list of {name: ...}.
func (p *fileParser) replaces(f field, path, own string) []string {
	t, ok := p.enter(f.val, path)
	if !ok {
		return nil
	}
	defer p.leave(f.val)
	if isNull(t) {
		return nil
	}
	if t.Kind != yaml.SequenceNode {
		p.fail(f.val, path, ErrType, "must be a list of {name: ...} (got %s)", kindName(t))
		return nil
	}
	var names []string
	for i, e := range t.Content {
		ep := index(path, i)
		et, ok := p.enter(e, ep)
		if !ok {
			return names
		}
		if et.Kind != yaml.MappingNode {
			p.fail(e, ep, ErrType, "must be a mapping {name: ...} (got %s)", kindName(et))
			p.leave(e)
			continue
		}
		name, at := "", et
		for _, g := range p.fields(et, ep, false) {
			gp := join(ep, g.name)
			switch {
			case g.name == "name":
				name, _ = p.str(g, gp)
				at = g.val
			case validKeys[g.name]:
				p.ignored(g, gp)
			default:
				p.unknown(g, gp, "replaces")
			}
		}
		p.leave(e)
		switch {
		case name == "":
			p.fail(at, join(ep, "name"), ErrInvalid, "should not have an empty replaces entry")
		case name == own:
			p.fail(at, join(ep, "name"), ErrInvalid, "replaces should not contain name of same descriptor (%q)", clip(name))
		default:
			names = append(names, name)
		}
	}
	return names
}

// metadata reads a descriptor's metadata: a mapping of anything.
func (p *fileParser) metadata(f field, path string) map[string]any {
	t, ok := p.enter(f.val, path)
	if !ok {
		return nil
	}
	defer p.leave(f.val)
	if isNull(t) {
		return nil
	}
	if t.Kind != yaml.MappingNode {
		p.fail(f.val, path, ErrType, "must be a mapping (got %s)", kindName(t))
		return nil
	}
	m, _ := p.metaValue(f.val, path).(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

// metaValue converts any YAML value to what structpb.NewValue accepts.
func (p *fileParser) metaValue(n *yaml.Node, path string) any {
	t, ok := p.enter(n, path)
	if !ok {
		return nil
	}
	defer p.leave(n)
	switch t.Kind {
	case yaml.MappingNode:
		m := make(map[string]any)
		for _, f := range p.fields(t, path, true) {
			m[f.name] = p.metaValue(f.val, join(path, f.name))
		}
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(t.Content))
		for i, e := range t.Content {
			s = append(s, p.metaValue(e, index(path, i)))
		}
		return s
	case yaml.ScalarNode:
		if v, ok := scalarBool(t); ok {
			return v
		}
		switch t.ShortTag() {
		case "!!null":
			return nil
		case "!!int":
			var i int64
			if t.Decode(&i) == nil {
				return i
			}
			var u uint64
			if t.Decode(&u) == nil {
				return u
			}
		case "!!float":
			var fl float64
			if t.Decode(&fl) == nil {
				return fl
			}
		case "!!binary":
			if b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(t.Value), "")); err == nil {
				return string(b)
			}
		}
		return t.Value
	}
	return nil
}
