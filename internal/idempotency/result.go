package idempotency

import (
	"encoding/json"
	"fmt"

	"github.com/orderservice/orderservice/internal/problem"
)

// Outcome says what came of an intent, in words no transport owns.
type Outcome string

// The definitive outcomes.
const (
	// OutcomeCreated: the intent brought a new resource into being.
	OutcomeCreated Outcome = "created"
	// OutcomeDone: the intent acted on an existing resource.
	OutcomeDone Outcome = "done"
	// OutcomeAccepted: the intent was taken on and will finish later
	// (a payment the channel settles asynchronously). That answer is the
	// intent's, replayed to its retries; how it finishes is told by the
	// resource (the order), not by the record.
	OutcomeAccepted Outcome = "accepted"
	// OutcomeFailed: the intent was refused for good (a domain error); the
	// refusal is stored and replayed like a success.
	OutcomeFailed Outcome = "failed"
)

// Result is the definitive outcome of an intent as a use case returns it and
// a record stores it: what happened, to which resource, and the
// representation a replay sends again. Each transport renders it (HTTP:
// status, Location, body); rendering the stored Result is deterministic, so
// a replay is the same bytes as the first answer.
type Result struct {
	Outcome  Outcome
	Resource string
	// Body is the resource's representation after the intent (created,
	// done), kept byte for byte.
	Body []byte
	// Failure is the domain error of a failed intent.
	Failure *problem.Error
	// Replayed is true when the result came from a stored record.
	Replayed bool
}

// Created is the result of an intent that made the resource id, shown as body.
func Created(id string, body []byte) Result {
	return Result{Outcome: OutcomeCreated, Resource: id, Body: body}
}

// Done is the result of an intent that acted on the resource id, shown as body.
func Done(id string, body []byte) Result {
	return Result{Outcome: OutcomeDone, Resource: id, Body: body}
}

// Accepted is the result of an intent that was taken on for the resource
// id, shown as body, and finishes later.
func Accepted(id string, body []byte) Result {
	return Result{Outcome: OutcomeAccepted, Resource: id, Body: body}
}

// Failed is the result of an intent refused for good with err, on resource
// id ("" when it names none).
func Failed(id string, err *problem.Error) Result {
	return Result{Outcome: OutcomeFailed, Resource: id, Failure: err}
}

// state is the record state the result is stored in.
func (r Result) state() State {
	if r.Outcome == OutcomeFailed {
		return FailedFinal
	}
	return Succeeded
}

// stored is the result as its record's columns hold it: the outcome, the
// failure's code (so it can be queried), and the body, which for a failure
// is its JSON form.
func (r Result) stored() (outcome Outcome, code *string, body []byte, err error) {
	switch r.Outcome {
	case OutcomeCreated, OutcomeDone, OutcomeAccepted:
		return r.Outcome, nil, r.Body, nil
	case OutcomeFailed:
		if r.Failure == nil {
			return "", nil, nil, fmt.Errorf("idempotency: a failed result needs its failure")
		}
		c := string(r.Failure.Code)
		body, err := json.Marshal(r.Failure)
		return r.Outcome, &c, body, err
	}
	return "", nil, nil, fmt.Errorf("idempotency: no outcome %q", r.Outcome)
}

// Disposition names what the idempotency layer did with a request: the one
// set of words the metrics' outcome label and the request log use, whatever
// transport the request came by.
type Disposition string

// The dispositions, named as their values read.
const (
	DispositionExecuted           Disposition = "executed"
	DispositionReplayed           Disposition = "replayed"
	DispositionKeyReused          Disposition = "key_reused"
	DispositionInProgress         Disposition = "in_progress"
	DispositionValidationRejected Disposition = "validation_rejected"
	DispositionUnauthenticated    Disposition = "unauthenticated"
	DispositionUnavailable        Disposition = "unavailable"
	DispositionFailed             Disposition = "failed"
)

// Dispositions lists every disposition, for metrics that start at zero.
var Dispositions = []Disposition{DispositionExecuted, DispositionReplayed, DispositionKeyReused, DispositionInProgress, DispositionValidationRejected, DispositionUnauthenticated, DispositionUnavailable, DispositionFailed}

// DispositionOf names what came of a request: its result when err is nil,
// else the error's code.
func DispositionOf(res Result, err error) Disposition {
	if err == nil {
		switch {
		case res.Replayed:
			return DispositionReplayed
		case res.Outcome == OutcomeFailed:
			return DispositionFailed
		}
		return DispositionExecuted
	}
	switch problem.CodeOf(err) {
	case problem.KeyReused:
		return DispositionKeyReused
	case problem.RequestInProgress:
		return DispositionInProgress
	case problem.InvalidRequest, problem.KeyMissing, problem.KeyInvalid, problem.PayloadTooLarge, problem.UnsupportedMediaType:
		return DispositionValidationRejected
	case problem.Unauthenticated:
		return DispositionUnauthenticated
	case problem.ServiceUnavailable:
		return DispositionUnavailable
	}
	return DispositionFailed
}
