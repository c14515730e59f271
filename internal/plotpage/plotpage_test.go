package plotpage

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// A page refers to nothing outside itself: no URL but the SVG namespaces,
// no script, and its attributes are escaped.
func TestPageSelfContained(t *testing.T) {
	pg := &Page{Title: `a <b> "c"`, Settings: [][2]string{{"targets", "127.0.0.1:7070"}}, Data: map[string]string{"Allowed Total": `1"2`},
		Sections: []Section{{Heading: "h", Text: []string{"<script>x</script>"}, Charts: []Chart{
			{ID: "lines", Title: "t <x>", Series: []Series{{Name: "s", X: []float64{0, 1, 2}, Y: []float64{1, 3, 2}, Step: true}},
				HLines: []Marker{{At: 2, Label: "limit 2"}}, VLines: []Marker{{At: 1, Label: "cut"}}, Grid: []float64{0.5, 1.5},
				Spans: []Span{{From: 1, To: 1.5, Label: "partition"}}, YZero: true},
			{ID: "bars", Bars: &Bars{Categories: []string{"a", "b"}, Sets: []BarSet{{Name: "x", Values: []float64{1, 2}}, {Name: "y", Values: []float64{0, 3}}}}},
		}}}}
	var b bytes.Buffer
	if err := pg.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	urls := regexp.MustCompile(`(?i)(https?:|url\(|src=|href=|@import|<script)`).FindAllString(
		strings.NewReplacer(`xmlns="http://www.w3.org/2000/svg"`, "", `xmlns:xlink="http://www.w3.org/1999/xlink"`, "").Replace(html), -1)
	if len(urls) > 0 {
		t.Errorf("the page refers outside itself: %q", urls)
	}
	for _, want := range []string{`data-allowed-total="1&#34;2"`, `&lt;script&gt;`, `<figure class="chart" id="lines"`, `<figure class="chart" id="bars"`, "Content-Security-Policy"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if n := strings.Count(html, "<svg"); n != 2 {
		t.Errorf("%d SVG charts, want 2", n)
	}
}
