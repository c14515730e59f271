package filestamp

import "testing"

// Stamps differ when a file's name or any of its bytes differ, and not
// otherwise; the stamps of two files do not run into each other.
func TestAppend(t *testing.T) {
	s := func(name, data string) string { return string(Append(nil, name, []byte(data))) }
	if s("a", "xy") != s("a", "xy") {
		t.Error("the same file stamped twice differs")
	}
	for _, other := range []string{s("b", "xy"), s("a", "xz"), s("a", "xy\x00"), s("a", "")} {
		if other == s("a", "xy") {
			t.Errorf("%q: a different file or contents, the same stamp", other)
		}
	}
	two := string(Append(Append(nil, "a", []byte("1")), "b", []byte("2")))
	if two != s("a", "1")+s("b", "2") {
		t.Errorf("two files: %q", two)
	}
}
