package idempotency

import (
	"math"

	"gorm.io/gorm"
)

// Gauges is what the records table looks like now, for the metrics. It is
// read in one statement whose cost does not grow with the table: the
// unfinished records are counted exactly through the sweeper's partial
// index (they are few: work in flight and work left by dead owners), and
// the finished ones are estimated from PostgreSQL's own statistics.
type Gauges struct {
	// Records by state. PROCESSING and FAILED_RETRYABLE are exact;
	// SUCCEEDED and FAILED_FINAL are estimates: the table's live rows as the
	// statistics system counts them (it lags commits by up to a few
	// seconds), less the unfinished ones, split by FAILED_FINAL's share in
	// the planner statistics (all SUCCEEDED before the first ANALYZE).
	Records map[State]int64
	// ExpiredProcessing counts PROCESSING records whose lease has run out:
	// work a dead owner left, waiting for a takeover.
	ExpiredProcessing int64
	// Retried counts unfinished records attempted 5 times or more.
	Retried int64
	// TableBytes is the table's size with its indexes and TOAST.
	TableBytes int64
	// Archived estimates the archive's rows, as the statistics count them.
	Archived int64
	// Inbox estimates the webhook deliveries remembered (webhook_inbox).
	Inbox int64
}

// RetriedAttempts is the attempt count from which Gauges.Retried counts
// an unfinished record.
const RetriedAttempts = 5

// Gauges reads the table's gauges (see the type) in one statement.
func (s *Store) Gauges(db *gorm.DB) (Gauges, error) {
	var row struct {
		Processing, Retryable, Expired, Retried int64
		Live, Archived, Bytes, Inbox            int64
		FinalShare                              float64
	}
	err := db.Raw(`
		WITH unfinished AS (
			SELECT state, attempts, lease_expires_at
			FROM idempotency_records
			WHERE lease_expires_at IS NOT NULL AND state IN ('PROCESSING', 'FAILED_RETRYABLE')
		)
		SELECT
			(SELECT count(*) FROM unfinished WHERE state = 'PROCESSING') AS processing,
			(SELECT count(*) FROM unfinished WHERE state = 'FAILED_RETRYABLE') AS retryable,
			(SELECT count(*) FROM unfinished WHERE state = 'PROCESSING' AND lease_expires_at < now()) AS expired,
			(SELECT count(*) FROM unfinished WHERE attempts >= ?) AS retried,
			COALESCE((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'idempotency_records'::regclass), 0) AS live,
			COALESCE((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'idempotency_archive'::regclass), 0) AS archived,
			COALESCE((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'webhook_inbox'::regclass), 0) AS inbox,
			pg_total_relation_size('idempotency_records') AS bytes,
			COALESCE((SELECT m.f FROM pg_stats st, unnest(st.most_common_vals::text::text[], st.most_common_freqs) AS m(v, f)
			          WHERE st.schemaname = current_schema() AND st.tablename = 'idempotency_records'
			            AND st.attname = 'state' AND m.v = 'FAILED_FINAL'), 0) AS final_share`,
		RetriedAttempts).Find(&row).Error
	if err != nil {
		return Gauges{}, err
	}
	finished := max(0, row.Live-row.Processing-row.Retryable)
	final := int64(math.Round(float64(finished) * row.FinalShare))
	return Gauges{
		Records: map[State]int64{Processing: row.Processing, FailedRetryable: row.Retryable,
			Succeeded: finished - final, FailedFinal: final},
		ExpiredProcessing: row.Expired, Retried: row.Retried, TableBytes: row.Bytes, Archived: row.Archived, Inbox: row.Inbox,
	}, nil
}
