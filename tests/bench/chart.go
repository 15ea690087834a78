package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"strconv"
	"time"
)

// series is one line of a chart panel: a value per concurrency.
type series struct {
	name   string
	color  string
	dashed bool
	values []float64
}

// Colours of the three create paths, shared by both panels.
const (
	colorService = "#1f77b4"
	colorDirect  = "#2ca02c"
	colorPlain   = "#ff7f0e"
)

// chart draws scenarios 1 and 2 as an SVG: throughput against concurrency
// on the left, p50 (solid) and p99 (dashed) latency on a log scale on the
// right. It is plain SVG written here: two line panels do not need a
// plotting library.
func chart(res *results) []byte {
	labels := make([]string, len(res.Levels))
	pick := func(f func(createLevel) float64) []float64 {
		v := make([]float64, len(res.Levels))
		for i, l := range res.Levels {
			v[i] = f(l)
		}
		return v
	}
	millis := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for i, l := range res.Levels {
		labels[i] = strconv.Itoa(l.Concurrency)
	}
	throughput := []series{
		{name: "service", color: colorService, values: pick(func(l createLevel) float64 { return l.Service.Throughput })},
		{name: "direct pgx", color: colorDirect, values: pick(func(l createLevel) float64 { return l.Direct.Throughput })},
	}
	latency := []series{
		{name: "service p50", color: colorService, values: pick(func(l createLevel) float64 { return millis(l.Service.P50) })},
		{name: "service p99", color: colorService, dashed: true, values: pick(func(l createLevel) float64 { return millis(l.Service.P99) })},
		{name: "direct p50", color: colorDirect, values: pick(func(l createLevel) float64 { return millis(l.Direct.P50) })},
		{name: "direct p99", color: colorDirect, dashed: true, values: pick(func(l createLevel) float64 { return millis(l.Direct.P99) })},
	}
	throughput = append(throughput, series{name: "without a record (pgx)", color: colorPlain,
		values: pick(func(l createLevel) float64 { return l.Plain.Throughput })})
	latency = append(latency,
		series{name: "no record p50", color: colorPlain, values: pick(func(l createLevel) float64 { return millis(l.Plain.P50) })},
		series{name: "no record p99", color: colorPlain, dashed: true, values: pick(func(l createLevel) float64 { return millis(l.Plain.P99) })})

	const width, height = 1000, 430
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" text-anchor="middle" font-size="15">Create an order: closed loop, %d CPUs, %s per point (%s)</text>`+"\n",
		width/2, res.Machine.CPUs, res.Opts.Duration, html.EscapeString(res.Machine.Date.Format("2006-01-02")))
	panel(&b, 70, "throughput (successful creates/s)", labels, throughput, false)
	panel(&b, 570, "latency (ms, log scale): p50 solid, p99 dashed", labels, latency, true)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// panel draws one 380×260 plot with its top-left corner at (x0, 50).
func panel(b *bytes.Buffer, x0 float64, title string, labels []string, lines []series, logY bool) {
	const y0, w, h = 50.0, 380.0, 260.0
	lo, hi := 0.0, 0.0
	for _, s := range lines {
		for _, v := range s.values {
			if v > 0 && (lo == 0 || v < lo) {
				lo = v
			}
			hi = math.Max(hi, v)
		}
	}
	var ticks []float64
	var scale func(float64) float64
	if logY {
		if lo <= 0 {
			lo = 1
		}
		bottom, top := math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*1.01))))
		for d := bottom; d < top*1.001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				if t := d * m; t <= top*1.001 {
					ticks = append(ticks, t)
				}
			}
		}
		scale = func(v float64) float64 {
			v = math.Max(v, bottom)
			return y0 + h - h*(math.Log10(v)-math.Log10(bottom))/(math.Log10(top)-math.Log10(bottom))
		}
	} else {
		step := niceStep(hi / 5)
		top := step * math.Ceil(hi/step)
		if top == 0 {
			top, step = 1, 0.2
		}
		for t := 0.0; t <= top*1.0001; t += step {
			ticks = append(ticks, t)
		}
		scale = func(v float64) float64 { return y0 + h - h*v/top }
	}
	xAt := func(i int) float64 {
		if len(labels) == 1 {
			return x0 + w/2
		}
		return x0 + 20 + (w-40)*float64(i)/float64(len(labels)-1)
	}

	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="13">%s</text>`+"\n", x0+w/2, y0-12, html.EscapeString(title))
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#444"/>`+"\n", x0, y0, w, h)
	for _, t := range ticks {
		y := scale(t)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+w, y)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", x0-6, y, tickLabel(t))
	}
	for i, l := range labels {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", xAt(i), y0+h+16, l)
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">concurrency (requests in flight)</text>`+"\n", x0+w/2, y0+h+34)
	for _, s := range lines {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6,4"`
		}
		var pts bytes.Buffer
		for i, v := range s.values {
			fmt.Fprintf(&pts, "%.1f,%.1f ", xAt(i), scale(v))
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", pts.String(), s.color, dash)
		for i, v := range s.values {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xAt(i), scale(v), s.color)
		}
	}
	for i, s := range lines {
		lx, ly := x0+float64(i%2)*190, y0+h+56+float64(i/2)*18
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6,4"`
		}
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+24, ly, s.color, dash)
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" dominant-baseline="middle">%s</text>`+"\n", lx+30, ly, html.EscapeString(s.name))
	}
}

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func tickLabel(v float64) string {
	if v >= 1 || v == 0 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}
