package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/orderservice/orderservice/lab/lessons"
)

//go:embed web
var webFiles embed.FS

// server is the lab listening: the address it got and how to stop it.
type server struct {
	addr string
	http *http.Server
	lab  *lab
	stop context.CancelFunc
}

// start listens on cfg.listen (a bind error shows here, not later) and
// serves the lab in the background.
func start(ctx context.Context, cfg config) (*server, error) {
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.listen, err)
	}
	labCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := newLab(labCtx, cfg.Config)
	s := &server{addr: ln.Addr().String(), lab: l, stop: stop,
		http: &http.Server{Handler: routes(l), ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = s.http.Serve(ln) }()
	return s, nil
}

// close stops the lessons and the pages' event streams, then the server.
func (s *server) close(ctx context.Context) error {
	s.stop()
	err := s.http.Shutdown(ctx)
	s.lab.session.Close()
	return err
}

// routes is every route of the lab, in one place.
func routes(l *lab) http.Handler {
	static, _ := fs.Sub(webFiles, "web")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(static))
	// The page names favicon.svg; a browser that asks for /favicon.ico all
	// the same gets it too, not a 404 on every load.
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/svg+xml")
		http.ServeFileFS(w, r, static, "favicon.svg")
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /api/lessons", l.handleLessons)
	mux.HandleFunc("GET /api/events", l.handleEvents)
	mux.HandleFunc("POST /api/run", l.handleRun)
	mux.HandleFunc("POST /api/step", l.handleStep)
	mux.HandleFunc("POST /api/resend", l.handleResend)
	mux.HandleFunc("POST /api/send", l.handleSend)
	mux.HandleFunc("GET /api/faults", l.handleFaults)
	mux.HandleFunc("POST /api/faults", l.handleFaults)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// handleLessons lists the lessons in the seed's order, with the session's
// run id and results so far.
func (l *lab) handleLessons(w http.ResponseWriter, r *http.Request) {
	type item struct {
		Number int    `json:"number"`
		Title  string `json:"title"`
		Why    string `json:"why"`
		// Pitfall names the mistake of a pitfall lesson, listed in a
		// section of its own.
		Pitfall string `json:"pitfall,omitempty"`
		Passed  *bool  `json:"passed,omitempty"`
	}
	results := l.resultsSoFar()
	var list []item
	for _, ls := range lessons.All() {
		it := item{Number: ls.Number, Title: ls.Title, Why: ls.Why, Pitfall: ls.Pitfall}
		if p, ok := results[ls.Number]; ok {
			it.Passed = &p
		}
		list = append(list, it)
	}
	cfg := l.session.Config()
	l.mu.Lock()
	running, stepping := l.running, l.stepping
	l.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"lessons": list, "run_id": l.session.RunID(),
		"service": cfg.BaseURL, "channel": cfg.ChannelURL, "broker": cfg.NATSURL, "tenant": cfg.Tenant,
		"running": running, "stepping": stepping})
}

// handleEvents streams the session's events as Server-Sent Events: first
// those of the lesson on screen, then each as it happens.
func (l *lab) handleEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, errors.New("streaming unsupported"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	history, events, cancel := l.hub.subscribe()
	defer cancel()
	send := func(e lessons.Event) bool {
		b, err := json.Marshal(e)
		if err != nil {
			return false
		}
		_, err = fmt.Fprintf(w, "data: %s\n\n", b)
		return err == nil
	}
	for _, e := range history {
		if !send(e) {
			return
		}
	}
	flusher.Flush()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case e, open := <-events:
			if !open || !send(e) {
				return
			}
			flusher.Flush()
		case <-ping.C:
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-r.Context().Done():
			return
		case <-l.ctx.Done():
			return
		}
	}
}

// handleRun starts one lesson ({"lesson": n}) or all of them ({"lesson": 0}),
// stepping when asked.
func (l *lab) handleRun(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Lesson int  `json:"lesson"`
		Step   bool `json:"step"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	list := lessons.All()
	if req.Lesson != 0 {
		ls, ok := lessons.ByNumber(req.Lesson)
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Errorf("no lesson %d", req.Lesson))
			return
		}
		list = []lessons.Lesson{ls}
	}
	if err := l.play(list, req.Step); err != nil {
		writeError(w, http.StatusConflict, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// handleStep lets the waiting request go ({"all": true}: and the rest).
func (l *lab) handleStep(w http.ResponseWriter, r *http.Request) {
	var req struct {
		All bool `json:"all"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err := l.step(req.All); err != nil {
		writeError(w, http.StatusConflict, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleResend sends a request of the timeline again, with its own key or
// a new one; the timeline shows what comes back.
func (l *lab) handleResend(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Request int  `json:"request"`
		NewKey  bool `json:"new_key"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	a, err := l.session.Resend(l.ctx, req.Request, req.NewKey)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// handleSend sends a request of the learner's own: an operation on an
// order (pay with a chosen method, cancel) or a new order.
func (l *lab) handleSend(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Operation     string `json:"operation"`
		OrderID       string `json:"order_id"`
		PaymentMethod string `json:"payment_method"`
		Key           string `json:"key"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	key := strings.TrimSpace(req.Key)
	if key == "" {
		key = fmt.Sprintf("%s-own-%d", l.session.RunID(), time.Now().UnixNano())
	}
	var path, body string
	switch req.Operation {
	case "create":
		path = "/v1/orders"
		body = fmt.Sprintf(`{"customer_id":"cus_%s_own","currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unit_price":1250}]}`,
			strings.ReplaceAll(l.session.RunID(), "-", "_"))
	case "pay", "cancel":
		if req.OrderID == "" || strings.ContainsAny(req.OrderID, "/?#") {
			writeError(w, http.StatusBadRequest, errors.New("order_id: the order to act on"))
			return
		}
		path = "/v1/orders/" + req.OrderID + "/" + req.Operation
		body = "{}"
		if req.Operation == "pay" {
			b, _ := json.Marshal(map[string]string{"payment_method": req.PaymentMethod})
			body = string(b)
		}
	default:
		writeError(w, http.StatusBadRequest, errors.New("operation must be create, pay or cancel"))
		return
	}
	a, err := l.session.Send(l.ctx, http.MethodPost, path, key, body)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// handleFaults reads or sets the channel's faults through its admin API:
// the toggles on the page are the channel's own.
func (l *lab) handleFaults(w http.ResponseWriter, r *http.Request) {
	url := l.session.Config().ChannelURL + "/admin/faults"
	var body io.Reader
	if r.Method == http.MethodPost {
		body = io.LimitReader(r.Body, 1<<16)
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, url, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("the channel's admin API at %s: %w", url, err))
		return
	}
	defer res.Body.Close()
	w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(res.Body, 1<<16))
}
