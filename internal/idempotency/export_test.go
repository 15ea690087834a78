package idempotency

import "gorm.io/gorm"

// Stale is what a request read of a taken scope, kept to be decided on later.
type Stale = observed

// ReadForTest reads scope as ClaimOrReplay does after its insert lost.
func (s *Store) ReadForTest(db *gorm.DB, scope Scope) (Stale, error) { return s.current(db, scope) }

// ResolveForTest decides on a taken scope from what was read of it earlier,
// so a test can let another owner move the record in between.
func (s *Store) ResolveForTest(tx *gorm.DB, in Intent, read Stale) (Claim, error) {
	return s.resolve(tx, in, read)
}
