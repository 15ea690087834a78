package naive

import (
	"encoding/json"
	"log"
	"net/http"
	"strconv"
	"time"
)

// holdAtMost bounds how long POST /admin/hold keeps the window open for
// requests that do not all come.
const holdAtMost = 5 * time.Second

// Handler serves the service's HTTP API. It takes any Authorization, or
// none: the naive service has a single tenant.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", func(w http.ResponseWriter, r *http.Request) {
		var req createRequest
		if !keyAndBody(w, r, &req) {
			return
		}
		if req.CustomerID == "" || len(req.Items) == 0 {
			write(w, problem(http.StatusBadRequest, "invalid_request", "customer_id and items are required"), false)
			return
		}
		out, replayed, err := s.create(r.Context(), r.Header.Get("Idempotency-Key"), req)
		answer(w, out, replayed, err)
	})
	mux.HandleFunc("POST /v1/orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			PaymentMethod string `json:"payment_method"`
		}
		if !keyAndBody(w, r, &req) {
			return
		}
		out, replayed, err := s.pay(r.Context(), r.PathValue("id"), r.Header.Get("Idempotency-Key"), req.PaymentMethod)
		answer(w, out, replayed, err)
	})
	mux.HandleFunc("GET /v1/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		o, err := s.order(r.Context(), r.PathValue("id"))
		switch {
		case err != nil:
			answer(w, reply{}, false, err)
		case o == nil:
			write(w, problem(http.StatusNotFound, "not_found", "no such order"), false)
		default:
			write(w, reply{http.StatusOK, mustJSON(o)}, false)
		}
	})
	mux.HandleFunc("GET /v1/orders", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.OrdersOf(r.Context(), r.URL.Query().Get("customer_id"))
		if list == nil {
			list = []Order{}
		}
		answer(w, reply{http.StatusOK, mustJSON(map[string]any{"orders": list})}, false, err)
	})
	// What a learner with curl needs to see the time-bound mistakes.
	mux.HandleFunc("POST /admin/advance", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("by"))
		if err != nil || d <= 0 {
			write(w, problem(http.StatusBadRequest, "invalid_request", "by must be a positive duration, e.g. ?by=48h"), false)
			return
		}
		s.clock.Advance(d)
		write(w, reply{http.StatusOK, mustJSON(map[string]any{"now": s.clock.Now().UTC()})}, false)
	})
	// The race of CheckThenInsert made certain, as lesson 19 makes it: the
	// next n creates wait between their check and their insert until all n
	// are in (at most 5 s). Without it the race is won by chance: a burst
	// from curl may well come out as one order.
	mux.HandleFunc("POST /admin/hold", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 1 || n > 100 {
			write(w, problem(http.StatusBadRequest, "invalid_request", "n must be a number of requests from 1 to 100, e.g. ?n=5"), false)
			return
		}
		s.HoldWindowOpen(n, holdAtMost)
		write(w, reply{http.StatusOK, mustJSON(map[string]any{"held": n, "at_most": holdAtMost.String(),
			"check_then_insert": s.m.CheckThenInsert})}, false)
	})
	mux.HandleFunc("POST /admin/cleanup", func(w http.ResponseWriter, r *http.Request) {
		n, err := s.Cleanup(r.Context())
		answer(w, reply{http.StatusOK, mustJSON(map[string]any{"deleted": n, "retention": s.RetentionWindow().String()})}, false, err)
	})
	return mux
}

// keyAndBody reads the Idempotency-Key and the JSON body, or answers 400.
func keyAndBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.Header.Get("Idempotency-Key") == "" {
		write(w, problem(http.StatusBadRequest, "idempotency_key_missing", "an Idempotency-Key header is required"), false)
		return false
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(v); err != nil {
		write(w, problem(http.StatusBadRequest, "invalid_request", "the body is not the expected JSON: "+err.Error()), false)
		return false
	}
	return true
}

func answer(w http.ResponseWriter, out reply, replayed bool, err error) {
	if err != nil {
		log.Printf("naiveorders: %v", err)
		out, replayed = problem(http.StatusInternalServerError, "internal", err.Error()), false
	}
	write(w, out, replayed)
}

func write(w http.ResponseWriter, out reply, replayed bool) {
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if out.Status == http.StatusCreated {
		var o struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(out.Body, &o)
		w.Header().Set("Location", "/v1/orders/"+o.ID)
	}
	if out.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(out.Status)
	_, _ = w.Write(out.Body)
}
