package idempotency

import (
	"strings"

	"github.com/orderservice/orderservice/internal/problem"
)

// MaxKeyLength is the longest Idempotency-Key accepted, after unquoting.
const MaxKeyLength = 255

// maxRawKeyLength is the longest header value accepted: the quoted form of
// the longest key, as api/openapi.yaml bounds it (maxLength 257).
const maxRawKeyLength = MaxKeyLength + 2

// ParseKeyHeader validates every value of an Idempotency-Key header, as any
// transport carries it (HTTP or message headers): exactly one is allowed,
// since two would leave it to chance which one names the intent.
func ParseKeyHeader(values []string) (string, error) {
	if len(values) > 1 {
		return "", invalidKey("the header was sent more than once")
	}
	if len(values) == 0 {
		return ParseKey("")
	}
	return ParseKey(values[0])
}

// ParseKey validates an Idempotency-Key header value. Keys are 1 to 255
// printable ASCII characters without spaces; the quoted structured-field form
// ("abc", RFC 8941 sf-string, as the IETF idempotency draft writes it) is
// accepted and unquoted, so "abc" and abc name the same intent. The value as
// sent is at most 257 characters, escapes included.
func ParseKey(raw string) (string, error) {
	if raw == "" {
		return "", problem.Errorf(problem.KeyMissing, "The Idempotency-Key header is required for this operation.")
	}
	if len(raw) > maxRawKeyLength {
		return "", invalidKey("it is longer than 257 characters")
	}
	key := raw
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		var ok bool
		if key, ok = unquote(raw[1 : len(raw)-1]); !ok {
			return "", invalidKey("it is not a valid quoted string")
		}
	}
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// CheckKey validates an unquoted key, taken literally: 1 to 255 printable
// ASCII characters without spaces.
func CheckKey(key string) error {
	if key == "" {
		return invalidKey("it is empty")
	}
	if len(key) > MaxKeyLength {
		return invalidKey("it is longer than 255 characters")
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return invalidKey("it may hold only printable ASCII characters without spaces")
		}
	}
	return nil
}

// unquote reverses sf-string escaping: only \" and \\ are escapes.
func unquote(s string) (string, bool) {
	if !strings.ContainsAny(s, `"\`) {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			return "", false
		case '\\':
			if i+1 == len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", false
			}
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String(), true
}

func invalidKey(why string) error {
	return problem.Errorf(problem.KeyInvalid, "The Idempotency-Key header is malformed: %s.", why)
}
