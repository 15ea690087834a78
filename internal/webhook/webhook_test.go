package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/webhook"
)

// The test vector the Standard Webhooks libraries share (libraries/go and
// libraries/python tests in github.com/standard-webhooks/standard-webhooks).
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorUnix      = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// otherSecret is a valid secret that did not sign the vector.
const otherSecret = "whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="

var vectorTime = time.Unix(vectorUnix, 0)

func vectorHeaders() http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderID, vectorID)
	h.Set(webhook.HeaderTimestamp, strconv.Itoa(vectorUnix))
	h.Set(webhook.HeaderSignature, vectorSignature)
	return h
}

func TestSign(t *testing.T) {
	t.Run("reproduces the specification's test vector", func(t *testing.T) {
		got, err := webhook.Sign(vectorSecret, vectorID, vectorTime, []byte(vectorBody))
		if err != nil || got != vectorSignature {
			t.Errorf("Sign = %q, %v; want %q", got, err, vectorSignature)
		}
	})

	t.Run("changes with each signed part", func(t *testing.T) {
		for name, sign := range map[string]func() (string, error){
			"secret": func() (string, error) { return webhook.Sign(otherSecret, vectorID, vectorTime, []byte(vectorBody)) },
			"id": func() (string, error) {
				return webhook.Sign(vectorSecret, vectorID+"x", vectorTime, []byte(vectorBody))
			},
			"timestamp": func() (string, error) {
				return webhook.Sign(vectorSecret, vectorID, vectorTime.Add(time.Second), []byte(vectorBody))
			},
			"body": func() (string, error) {
				return webhook.Sign(vectorSecret, vectorID, vectorTime, []byte(vectorBody+" "))
			},
		} {
			if got, err := sign(); err != nil || got == vectorSignature || !strings.HasPrefix(got, "v1,") {
				t.Errorf("another %s: Sign = %q, %v; want another v1 signature", name, got, err)
			}
		}
	})

	t.Run("refuses a bad secret or an id with a full stop", func(t *testing.T) {
		if _, err := webhook.Sign("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", vectorID, vectorTime, nil); !errors.Is(err, webhook.ErrInvalidSecret) {
			t.Errorf("secret without whsec_: %v, want ErrInvalidSecret", err)
		}
		if _, err := webhook.Sign(vectorSecret, "msg.1", vectorTime, nil); !errors.Is(err, webhook.ErrInvalidHeader) {
			t.Errorf("id with a full stop: %v, want ErrInvalidHeader", err)
		}
	})
}

func TestVerify(t *testing.T) {
	const tolerance = 5 * time.Minute
	verify := func(secrets []string, h http.Header, body string, now time.Time) error {
		return webhook.Verify(secrets, h, []byte(body), now, tolerance)
	}

	t.Run("accepts the specification's test vector", func(t *testing.T) {
		if err := verify([]string{vectorSecret}, vectorHeaders(), vectorBody, vectorTime); err != nil {
			t.Errorf("Verify = %v", err)
		}
	})

	t.Run("refuses what was not signed as it arrives", func(t *testing.T) {
		other := vectorHeaders()
		other.Set(webhook.HeaderID, "msg_other")
		later := vectorHeaders()
		later.Set(webhook.HeaderTimestamp, strconv.Itoa(vectorUnix+1))
		flipped := vectorHeaders()
		flipped.Set(webhook.HeaderSignature, strings.Replace(vectorSignature, "g0h", "g1h", 1))
		for name, c := range map[string]struct {
			secret, body string
			h            http.Header
		}{
			"a changed body":        {vectorSecret, `{"test": 2432232315}`, vectorHeaders()},
			"a body with a space":   {vectorSecret, vectorBody + " ", vectorHeaders()},
			"another id":            {vectorSecret, vectorBody, other},
			"another timestamp":     {vectorSecret, vectorBody, later},
			"a changed signature":   {vectorSecret, vectorBody, flipped},
			"another secret's body": {otherSecret, vectorBody, vectorHeaders()},
		} {
			if err := verify([]string{c.secret}, c.h, c.body, vectorTime); !errors.Is(err, webhook.ErrNoMatch) {
				t.Errorf("%s: Verify = %v, want ErrNoMatch", name, err)
			}
		}
	})

	t.Run("accepts any of several secrets, as during a rotation", func(t *testing.T) {
		if err := verify([]string{otherSecret, vectorSecret}, vectorHeaders(), vectorBody, vectorTime); err != nil {
			t.Errorf("Verify = %v", err)
		}
	})

	t.Run("accepts any of several signatures and ignores other schemes", func(t *testing.T) {
		h := vectorHeaders()
		h.Set(webhook.HeaderSignature, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v1a,bm90LWVkMjU1MTk= junk  "+vectorSignature)
		if err := verify([]string{vectorSecret}, h, vectorBody, vectorTime); err != nil {
			t.Errorf("Verify = %v", err)
		}
		// The right bytes under another version are not a v1 signature.
		h.Set(webhook.HeaderSignature, strings.Replace(vectorSignature, "v1,", "v2,", 1))
		if err := verify([]string{vectorSecret}, h, vectorBody, vectorTime); !errors.Is(err, webhook.ErrNoMatch) {
			t.Errorf("v2 signature: Verify = %v, want ErrNoMatch", err)
		}
	})

	t.Run("refuses a timestamp beyond the tolerance, either way", func(t *testing.T) {
		for _, now := range []time.Time{vectorTime.Add(tolerance), vectorTime.Add(-tolerance)} {
			if err := verify([]string{vectorSecret}, vectorHeaders(), vectorBody, now); err != nil {
				t.Errorf("now %s from the timestamp: Verify = %v, want nil", now.Sub(vectorTime), err)
			}
		}
		for _, now := range []time.Time{vectorTime.Add(tolerance + time.Second), vectorTime.Add(-tolerance - time.Second)} {
			if err := verify([]string{vectorSecret}, vectorHeaders(), vectorBody, now); !errors.Is(err, webhook.ErrStale) {
				t.Errorf("now %s from the timestamp: Verify = %v, want ErrStale", now.Sub(vectorTime), err)
			}
		}
	})

	t.Run("refuses a timestamp at the extremes of the clock", func(t *testing.T) {
		// The millisecond Unix time that got through once, the largest
		// int64, and zero: each far beyond the tolerance, neither way
		// overflows into "near".
		// Each is signed as it stands, so only the clock can refuse it.
		for _, unix := range []int64{99999999999, 1614265330000, math.MaxInt64, 0} {
			h := vectorHeaders()
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(unix, 10))
			h.Set(webhook.HeaderSignature, signAt(t, unix))
			if err := verify([]string{vectorSecret}, h, vectorBody, vectorTime); !errors.Is(err, webhook.ErrStale) {
				t.Errorf("timestamp %d: Verify = %v, want ErrStale", unix, err)
			}
		}
	})

	t.Run("names the missing header", func(t *testing.T) {
		for _, name := range []string{webhook.HeaderID, webhook.HeaderTimestamp, webhook.HeaderSignature} {
			h := vectorHeaders()
			h.Del(name)
			err := verify([]string{vectorSecret}, h, vectorBody, vectorTime)
			if !errors.Is(err, webhook.ErrMissingHeader) || !strings.Contains(err.Error(), name) {
				t.Errorf("without %s: Verify = %v, want ErrMissingHeader naming it", name, err)
			}
		}
	})

	t.Run("refuses a timestamp that is not plain Unix seconds", func(t *testing.T) {
		for _, stamp := range []string{"soon", "-1", "+1614265330", "01614265330", "1614265330.5", "1e9"} {
			h := vectorHeaders()
			h.Set(webhook.HeaderTimestamp, stamp)
			if err := verify([]string{vectorSecret}, h, vectorBody, vectorTime); !errors.Is(err, webhook.ErrInvalidHeader) {
				t.Errorf("timestamp %q: Verify = %v, want ErrInvalidHeader", stamp, err)
			}
		}
	})

	t.Run("refuses an id with a full stop", func(t *testing.T) {
		h := vectorHeaders()
		h.Set(webhook.HeaderID, "msg.1")
		if err := verify([]string{vectorSecret}, h, vectorBody, vectorTime); !errors.Is(err, webhook.ErrInvalidHeader) {
			t.Errorf("Verify = %v, want ErrInvalidHeader", err)
		}
	})

	t.Run("refuses bad secrets without quoting them", func(t *testing.T) {
		for name, secrets := range map[string][]string{
			"none":           nil,
			"no prefix":      {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
			"not base64":     {"whsec_MfKQ9r8GKYqr!wjUPD8ILPZIo2LaLaSw"},
			"too short":      {"whsec_c2hvcnQ="},
			"too long":       {"whsec_" + strings.Repeat("QUFB", 22)}, // 66 bytes
			"one bad of two": {vectorSecret, "whsec_"},
		} {
			err := verify(secrets, vectorHeaders(), vectorBody, vectorTime)
			if !errors.Is(err, webhook.ErrInvalidSecret) {
				t.Errorf("%s: Verify = %v, want ErrInvalidSecret", name, err)
			}
			for _, s := range secrets {
				if len(s) > len("whsec_") && err != nil && strings.Contains(err.Error(), strings.TrimPrefix(s, "whsec_")) {
					t.Errorf("%s: the error %q quotes the secret", name, err)
				}
			}
		}
	})
}

func TestSignThenVerify(t *testing.T) {
	now := time.Now()
	body := []byte(`{"type":"charge.succeeded","data":{"id":"ch_1"}}`)
	sig, err := webhook.Sign(otherSecret, "msg_1", now, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(webhook.HeaderID, "msg_1")
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, sig)
	if err := webhook.Verify([]string{otherSecret}, h, body, now, time.Minute); err != nil {
		t.Errorf("Verify = %v", err)
	}
	if err := webhook.Verify([]string{vectorSecret}, h, body, now, time.Minute); !errors.Is(err, webhook.ErrNoMatch) {
		t.Errorf("with another secret: Verify = %v, want ErrNoMatch", err)
	}
}

// signAt is the v1 signature of the vector's id and body at Unix time unix,
// computed here as the specification says, since Sign takes a time.Time,
// which cannot hold every int64 of seconds.
func signAt(t *testing.T, unix int64) string {
	t.Helper()
	key, err := webhook.ParseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(vectorID + "." + strconv.FormatInt(unix, 10) + "." + vectorBody))
	return "v1," + base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// A list of secrets is usable when it names at least one and each is in
// the "whsec_" form: a rotation lists the new one beside the old.
func TestCheckSecrets(t *testing.T) {
	if err := webhook.CheckSecrets([]string{vectorSecret}); err != nil {
		t.Errorf("one valid secret: %v", err)
	}
	if err := webhook.CheckSecrets(nil); err == nil {
		t.Error("no secret at all was accepted")
	}
	if err := webhook.CheckSecrets([]string{vectorSecret, "secret"}); !errors.Is(err, webhook.ErrInvalidSecret) {
		t.Errorf("a second secret not in the whsec_ form: %v, want ErrInvalidSecret", err)
	}
}
