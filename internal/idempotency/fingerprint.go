package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Fingerprint is the SHA-256, in hex, of the canonical form of one intent:
// the operation, the resource it acts on (the order id in the path, or "" for
// a create) and the normalised business fields.
//
// The caller owns normalisation: it passes a struct holding only the fields
// that change the side effect, already trimmed, upper-cased and sorted as its
// domain requires, and never trace data. encoding/json writes struct fields
// in declaration order and map keys sorted, so equal intents always hash
// equal whatever the key order or whitespace of the request body was.
func Fingerprint(operation, resource string, fields any) (string, error) {
	canonical, err := json.Marshal([]any{operation, resource, fields})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:]), nil
}
