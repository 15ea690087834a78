package messaging

// Waiting is how many commands of tenant wait for their intent in flight
// on this consumer, for tests.
func (c *Consumer) Waiting(tenant string) int { return c.serving.waiters.waiting(tenant) }
