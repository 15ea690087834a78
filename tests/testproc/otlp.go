package testproc

import (
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPReceiver is the smallest OTLP/HTTP trace receiver, on loopback, for
// a binary started with OTEL_EXPORTER_OTLP_ENDPOINT=URL: it decodes every
// export, as a collector would before doing anything with it, and counts
// the spans by their resource's service.name.
type OTLPReceiver struct {
	URL string
	srv *http.Server

	mu      sync.Mutex
	exports int
	spans   map[string]int
}

// StartOTLPReceiver listens on a free loopback port; Close stops it.
func StartOTLPReceiver() (*OTLPReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &OTLPReceiver{URL: "http://" + ln.Addr().String(), spans: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = &http.Server{Handler: mux}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *OTLPReceiver) export(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" { // OTEL_EXPORTER_OTLP_COMPRESSION=gzip
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &export)
	}
	if err != nil {
		http.Error(w, "not an OTLP trace export: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.exports++
	for _, rs := range export.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			r.spans[service] += len(ss.Spans)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Received returns how many exports arrived and the spans they held, by
// service.name.
func (r *OTLPReceiver) Received() (exports int, spans map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spans = make(map[string]int, len(r.spans))
	for k, v := range r.spans {
		spans[k] = v
	}
	return r.exports, spans
}

// Close stops the receiver.
func (r *OTLPReceiver) Close() error { return r.srv.Close() }
