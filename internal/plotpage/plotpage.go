// Package plotpage writes one self-contained HTML page of charts: the
// charts are drawn by gonum.org/v1/plot into SVG (its vg/vgsvg backend) and
// put inline in the page, so the page needs nothing but itself to be read:
// no script, no style sheet, no font or image is fetched when it is opened
// (a Content-Security-Policy of default-src 'none' says so to the browser
// as well). The text is set in the Liberation fonts plot measures with,
// named in the SVG by family only, never by URL: a browser without them
// falls back to a local sans-serif.
//
// loadtest's replay page and the fault suite's partition page are both
// written with it. Each chart and the page carry data-* attributes with the
// figures they show, so a test (or a script) can read the numbers back
// from the page instead of from the pixels.
package plotpage

import (
	"bytes"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
	// Step draws the value as holding from each X until the next.
	Step   bool
	Dashed bool
	// Color indexes Palette; Auto (the zero value) takes the series'
	// position in the chart.
	Color int
}

// Auto picks a series' color from its position.
const Auto = 0

// Palette is the colors of series, 1-based (Color 1 is Palette[0]).
var Palette = []color.RGBA{
	{0x1b, 0x9e, 0x45, 0xff}, // green: allowed
	{0xd9, 0x5f, 0x02, 0xff}, // orange: limited
	{0xc0, 0x10, 0x30, 0xff}, // red: errors
	{0x37, 0x5e, 0xb8, 0xff}, // blue
	{0x75, 0x70, 0xb3, 0xff}, // purple
	{0x66, 0x66, 0x66, 0xff}, // grey
	{0xe6, 0xab, 0x02, 0xff}, // yellow
	{0x1f, 0x78, 0xb4, 0xff}, // light blue
}

// Marker is a vertical (at an X) or horizontal (at a Y) line with a
// label, such as a limit, or the instant a partition began.
type Marker struct {
	At    float64
	Label string
	Color int // Palette index as Series.Color; Auto is black
}

// Span shades the X interval [From, To].
type Span struct {
	From, To float64
	Label    string
}

// Bars is a bar chart: one group of bars per category, one bar per set.
type Bars struct {
	Categories []string
	Sets       []BarSet
}

// BarSet is one bar in every category.
type BarSet struct {
	Name   string
	Values []float64
	Color  int
}

// Chart is one figure: lines (with markers, a grid and spans) or bars.
type Chart struct {
	ID                    string // the figure's id; letters, digits and '-'
	Title, XLabel, YLabel string
	Series                []Series
	HLines, VLines        []Marker
	// Grid draws light vertical lines at these X: a window grid.
	Grid  []float64
	Spans []Span
	Bars  *Bars
	// YMin fixes the bottom of the Y axis (NaN: from the data); YZero
	// starts it at 0.
	YZero   bool
	Caption string
	// Data is put on the figure as data-NAME attributes.
	Data map[string]string
	// Width and Height in points; 0: 760 × 300.
	Width, Height float64
}

func paint(i, auto int) color.Color {
	if i <= 0 {
		i = auto
	}
	if i <= 0 {
		return color.Black
	}
	return Palette[(i-1)%len(Palette)]
}

// SVG draws c as an SVG document (without the XML declaration, ready to be
// put inline in HTML).
func (c *Chart) SVG() ([]byte, error) {
	p := plot.New()
	sans(p)
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = 9
	p.Add(plotter.NewGrid())
	p.X.Tick.Marker, p.Y.Tick.Marker = trimmedTicks{}, trimmedTicks{}
	if c.Bars != nil {
		if err := c.addBars(p); err != nil {
			return nil, err
		}
	} else if err := c.addLines(p); err != nil {
		return nil, err
	}
	w, h := c.Width, c.Height
	if w == 0 {
		w, h = 760, 300
	}
	canvas := vgsvg.New(vg.Length(w)*vg.Points(1), vg.Length(h)*vg.Points(1))
	p.Draw(draw.New(canvas))
	var buf bytes.Buffer
	if _, err := canvas.WriteTo(&buf); err != nil {
		return nil, err
	}
	out := buf.Bytes()
	if i := bytes.Index(out, []byte("<svg")); i >= 0 {
		out = out[i:] // drop the XML declaration and the generator comment
	}
	// A size in points, scaled down to the page's width by CSS.
	out = svgSize.ReplaceAll(out, []byte(`<svg role="img" width="${1}pt" height="${2}pt" style="max-width:100%;height:auto"`))
	return out, nil
}

// sans sets every text of p in Liberation Sans, one of the fonts plot
// embeds for measuring text.
func sans(p *plot.Plot) {
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font,
		&p.X.Tick.Label.Font, &p.Y.Tick.Label.Font, &p.Legend.TextStyle.Font} {
		f.Typeface, f.Variant = "Liberation", "Sans"
	}
}

// trimmedTicks are plot's default ticks, labelled without trailing zeros
// (500, not 500.00).
type trimmedTicks struct{}

func (trimmedTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if l := ts[i].Label; strings.Contains(l, ".") && !strings.ContainsAny(l, "eE") {
			ts[i].Label = strings.TrimSuffix(strings.TrimRight(l, "0"), ".")
		}
	}
	return ts
}

var svgSize = regexp.MustCompile(`^<svg width="([0-9.]+)pt" height="([0-9.]+)pt"`)

func (c *Chart) addLines(p *plot.Plot) error {
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	for _, m := range c.HLines {
		ymin, ymax = math.Min(ymin, m.At), math.Max(ymax, m.At)
	}
	for _, m := range c.VLines {
		xmin, xmax = math.Min(xmin, m.At), math.Max(xmax, m.At)
	}
	for _, s := range c.Spans {
		xmin, xmax = math.Min(xmin, s.From), math.Max(xmax, s.To)
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	if math.IsInf(ymin, 0) {
		ymin, ymax = 0, 1
	}
	if c.YZero {
		ymin = math.Min(0, ymin)
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	ymax += (ymax - ymin) * (0.1 + 0.05*float64(len(c.Series))) // room for the legend and the labels
	if xmax <= xmin {
		xmax = xmin + 1
	}
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xmin, xmax, ymin, ymax

	for _, s := range c.Spans {
		poly, err := plotter.NewPolygon(plotter.XYs{{X: s.From, Y: ymin}, {X: s.To, Y: ymin}, {X: s.To, Y: ymax}, {X: s.From, Y: ymax}})
		if err != nil {
			return err
		}
		poly.Color = color.RGBA{0xee, 0xe4, 0xf6, 0xff}
		poly.LineStyle.Width = 0
		p.Add(poly)
		if s.Label != "" {
			p.Legend.Add(s.Label, poly)
		}
	}
	for _, x := range c.Grid {
		if x < xmin || x > xmax {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: ymin}, {X: x, Y: ymax}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{0xb0, 0xb0, 0xb0, 0xff}
		l.Width = vg.Points(0.6)
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
	}
	for i, s := range c.Series {
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			xys[j] = plotter.XY{X: s.X[j], Y: s.Y[j]}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plotpage: series %q: %w", s.Name, err)
		}
		if s.Step {
			l.StepStyle = plotter.PostStep
		}
		l.Color = paint(s.Color, i+1)
		l.Width = vg.Points(1.2)
		if s.Dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	marker := func(m Marker, xys plotter.XYs, labelAt plotter.XY) error {
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color = paint(m.Color, 0)
		l.Width = vg.Points(1)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(2)}
		p.Add(l)
		if m.Label != "" {
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{labelAt}, Labels: []string{m.Label}})
			if err != nil {
				return err
			}
			for i := range lb.TextStyle {
				lb.TextStyle[i].Font.Typeface, lb.TextStyle[i].Font.Variant = "Liberation", "Sans"
				lb.TextStyle[i].Font.Size = 8
				lb.TextStyle[i].Color = l.Color
			}
			lb.Offset = vg.Point{X: vg.Points(2), Y: vg.Points(2)}
			p.Add(lb)
		}
		return nil
	}
	for _, m := range c.HLines {
		if err := marker(m, plotter.XYs{{X: xmin, Y: m.At}, {X: xmax, Y: m.At}}, plotter.XY{X: xmin + (xmax-xmin)*0.4, Y: m.At}); err != nil {
			return err
		}
	}
	for _, m := range c.VLines {
		if err := marker(m, plotter.XYs{{X: m.At, Y: ymin}, {X: m.At, Y: ymax}}, plotter.XY{X: m.At, Y: ymin + (ymax-ymin)*0.02}); err != nil {
			return err
		}
	}
	return nil
}

func (c *Chart) addBars(p *plot.Plot) error {
	b := c.Bars
	n := len(b.Sets)
	w := vg.Points(float64(min(40, 300/max(1, n*max(1, len(b.Categories))))))
	ymax := 0.0
	for i, s := range b.Sets {
		vals := make(plotter.Values, len(b.Categories))
		for j := range vals {
			if j < len(s.Values) {
				vals[j] = s.Values[j]
				ymax = math.Max(ymax, vals[j])
			}
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("plotpage: bars %q: %w", s.Name, err)
		}
		bc.Color = paint(s.Color, i+1)
		bc.LineStyle.Width = 0
		bc.Offset = vg.Length(float64(i)-float64(n-1)/2) * w
		p.Add(bc)
		p.Legend.Add(s.Name, bc)
	}
	p.NominalX(b.Categories...)
	p.Y.Min, p.Y.Max = 0, math.Max(1, ymax*1.25)
	return nil
}

// FigureTable is a table of figures; Data, when set, holds each row's data-*
// attributes.
type FigureTable struct {
	ID   string
	Head []string
	Rows [][]string
	Data []map[string]string
}

// Section is a heading, paragraphs, tables and charts.
type Section struct {
	Heading string
	Text    []string
	Tables  []FigureTable
	Charts  []Chart
}

// Page is one HTML document.
type Page struct {
	Title string
	// Settings are what the page's figures were made with, shown first as
	// name: value.
	Settings [][2]string
	// Data is put on the page's <main> as data-NAME attributes.
	Data     map[string]string
	Sections []Section
}

type figure struct {
	ID      string
	SVG     template.HTML
	Caption string
	Data    template.HTMLAttr
}

type tableView struct {
	ID   string
	Head []string
	Rows []rowView
}

type rowView struct {
	Cells []string
	Data  template.HTMLAttr
}

type sectionView struct {
	Heading string
	Text    []string
	Tables  []tableView
	Figures []figure
}

// WriteHTML draws every chart and writes the page.
func (pg *Page) WriteHTML(w io.Writer) error {
	view := struct {
		Title    string
		Settings [][2]string
		Data     template.HTMLAttr
		Sections []sectionView
		CSP      string
	}{Title: pg.Title, Settings: pg.Settings, Data: attrs(pg.Data), CSP: CSP}
	for _, s := range pg.Sections {
		sv := sectionView{Heading: s.Heading, Text: s.Text}
		for _, t := range s.Tables {
			tv := tableView{ID: t.ID, Head: t.Head}
			for i, r := range t.Rows {
				rv := rowView{Cells: r}
				if i < len(t.Data) {
					rv.Data = attrs(t.Data[i])
				}
				tv.Rows = append(tv.Rows, rv)
			}
			sv.Tables = append(sv.Tables, tv)
		}
		for i := range s.Charts {
			c := &s.Charts[i]
			svg, err := c.SVG()
			if err != nil {
				return err
			}
			sv.Figures = append(sv.Figures, figure{ID: c.ID, SVG: template.HTML(svg), Caption: c.Caption, Data: attrs(c.Data)})
		}
		view.Sections = append(view.Sections, sv)
	}
	return pageTmpl.Execute(w, view)
}

// CSP is the page's Content-Security-Policy: nothing may be fetched; inline
// style (the SVG's) and data: images only.
const CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

// attrs renders m as data-NAME="value" attributes, names sorted, each
// name reduced to lower-case letters, digits and '-'.
func attrs(m map[string]string) template.HTMLAttr {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, ` data-%s="%s"`, AttrName(k), template.HTMLEscapeString(m[k]))
	}
	return template.HTMLAttr(b.String())
}

// AttrName reduces s to a data attribute's name: lower-case letters,
// digits and '-', every other run of bytes one '-'.
func AttrName(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

// Ints formats vs as a comma-separated list, for a data attribute.
func Ints(vs []int64) string {
	var b []byte
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}

// Floats formats vs as a comma-separated list, for a data attribute.
func Floats(vs []float64) string {
	var b []byte
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	return string(b)
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{.CSP}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font-family: "Liberation Sans", Arial, Helvetica, sans-serif; margin: 1.5em auto; max-width: 1060px; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
dl.settings { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; font-size: .92em; }
dl.settings dt { font-weight: bold; } dl.settings dd { margin: 0; font-family: "Liberation Mono", monospace; }
table { border-collapse: collapse; font-size: .9em; margin: .6em 0; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; } th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } figcaption { font-size: .85em; color: #555; }
</style>
</head>
<body>
<main{{.Data}}>
<h1>{{.Title}}</h1>
<dl class="settings">
{{range .Settings}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>
{{end}}</dl>
{{range .Sections}}<section>
<h2>{{.Heading}}</h2>
{{range .Text}}<p>{{.}}</p>
{{end}}{{range .Tables}}<table{{if .ID}} id="{{.ID}}"{{end}}>
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr{{.Data}}>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}{{range .Figures}}<figure class="chart"{{if .ID}} id="{{.ID}}"{{end}}{{.Data}}>
{{.SVG}}
{{if .Caption}}<figcaption>{{.Caption}}</figcaption>{{end}}
</figure>
{{end}}</section>
{{end}}</main>
</body>
</html>
`))
