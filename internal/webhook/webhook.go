// Package webhook signs and verifies webhooks as Standard Webhooks 1.0
// prescribes (https://www.standardwebhooks.com): an HMAC-SHA256 over
// "{webhook-id}.{webhook-timestamp}.{body}" with a secret shared by sender
// and receiver, sent as "v1,<base64>" in the webhook-signature header.
//
// The official Go library would not save much here: it takes one secret,
// checks the timestamp against its own clock with a fixed five-minute
// tolerance, and accepts secrets without the whsec_ prefix.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a Standard Webhooks delivery.
const (
	// HeaderID names the event: the same on every delivery of it.
	HeaderID = "webhook-id"
	// HeaderTimestamp is when this delivery was signed, in Unix seconds.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature holds space-separated signatures, "v1,<base64>" each.
	HeaderSignature = "webhook-signature"
)

// Why a delivery does not verify, matched with errors.Is. No message
// carries a secret or a signature we computed.
var (
	ErrMissingHeader = errors.New("missing header")
	ErrInvalidHeader = errors.New("invalid header")
	ErrInvalidSecret = errors.New("invalid secret")
	// ErrStale: the timestamp is further from now than the tolerance, in
	// either direction; a captured delivery cannot be replayed later.
	ErrStale   = errors.New("timestamp outside the tolerance")
	ErrNoMatch = errors.New("no signature matches")
)

// Secrets are "whsec_" and base64 of 24 to 64 random bytes, as the
// specification sets them.
const (
	secretPrefix   = "whsec_"
	minSecretBytes = 24
	maxSecretBytes = 64
)

// ParseSecret returns the key bytes of a secret in the "whsec_" form.
func ParseSecret(secret string) ([]byte, error) {
	encoded, ok := strings.CutPrefix(secret, secretPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: it must begin with %q", ErrInvalidSecret, secretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return nil, fmt.Errorf("%w: what follows %q is not standard base64", ErrInvalidSecret, secretPrefix)
	}
	if len(key) < minSecretBytes || len(key) > maxSecretBytes {
		return nil, fmt.Errorf("%w: it holds %d bytes, not %d to %d", ErrInvalidSecret, len(key), minSecretBytes, maxSecretBytes)
	}
	return key, nil
}

// CheckSecrets says why a list of secrets, as a setting holds them, cannot
// be used: it names none, or one is not in the "whsec_" form.
func CheckSecrets(secrets []string) error {
	if len(secrets) == 0 {
		return errors.New("must name at least one secret")
	}
	for _, secret := range secrets {
		if _, err := ParseSecret(secret); err != nil {
			return err
		}
	}
	return nil
}

// Sign returns the "v1,<base64>" signature of body sent as event id at
// timestamp, whose header must read strconv.FormatInt(timestamp.Unix(), 10).
func Sign(secret, id string, timestamp time.Time, body []byte) (string, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return "", err
	}
	if err := checkID(id); err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, strconv.FormatInt(timestamp.Unix(), 10), body)), nil
}

// Verify returns nil when one of the v1 signatures in headers was made over
// body by one of secrets (several while a secret is rotated) and the
// timestamp is within tolerance of now.
func Verify(secrets []string, headers http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, stamp, signatures := headers.Get(HeaderID), headers.Get(HeaderTimestamp), headers.Get(HeaderSignature)
	for _, name := range []string{HeaderID, HeaderTimestamp, HeaderSignature} {
		if headers.Get(name) == "" {
			return fmt.Errorf("%w: %s", ErrMissingHeader, name)
		}
	}
	if len(secrets) == 0 {
		return fmt.Errorf("%w: none configured", ErrInvalidSecret)
	}
	keys := make([][]byte, 0, len(secrets))
	for _, s := range secrets {
		key, err := ParseSecret(s)
		if err != nil {
			return err
		}
		keys = append(keys, key)
	}
	if err := checkID(id); err != nil {
		return err
	}
	// Only the canonical form, so that the signed text is the header's.
	unix, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil || unix < 0 || strconv.FormatInt(unix, 10) != stamp {
		return fmt.Errorf("%w: %s %q is not Unix seconds", ErrInvalidHeader, HeaderTimestamp, stamp)
	}
	if off := secondsApart(now.Unix(), unix); off > int64(tolerance/time.Second) {
		return fmt.Errorf("%w: %s is %d s from now, more than %s", ErrStale, HeaderTimestamp, off, tolerance)
	}
	for _, sig := range strings.Fields(signatures) {
		version, encoded, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(encoded)
		if version != "v1" || err != nil {
			continue // another scheme (v1a), or not one we could have made
		}
		for _, key := range keys {
			if hmac.Equal(got, mac(key, id, stamp, body)) {
				return nil
			}
		}
	}
	return ErrNoMatch
}

// secondsApart is |a − b| for two non-negative Unix times, in seconds. It
// cannot overflow, where a time.Duration between them would: a timestamp
// centuries away (a millisecond one, 99999999999) is further than
// time.Duration reaches, and time.Time.Sub saturates to a value whose
// negation is itself, which would pass a check of both directions.
func secondsApart(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// checkID refuses an id with a full stop, which would let the id and the
// timestamp trade characters in the signed text.
func checkID(id string) error {
	if id == "" || strings.Contains(id, ".") {
		return fmt.Errorf("%w: %s %q must be non-empty and without a full stop", ErrInvalidHeader, HeaderID, id)
	}
	return nil
}

func mac(key []byte, id, stamp string, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id + "." + stamp + "."))
	h.Write(body)
	return h.Sum(nil)
}
