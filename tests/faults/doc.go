//go:build faults

// Package faults is the fault and load suite: it builds the real
// orderservice and paymentchannel binaries, runs several instances of them
// on loopback against one fresh PostgreSQL database, and then breaks
// things — concurrent duplicates across instances, a TCP fault proxy in
// front of PostgreSQL and the channel, a PostgreSQL restart, SIGKILLed
// instances, clients that hang up — asserting exact counts of orders and
// charges after each.
//
// Every file carries the faults build tag: one scenario restarts the local
// PostgreSQL server, which must never happen while `make test` runs other
// packages against it. Run the suite alone with `make test-faults`; add
// -short for the reduced version.
package faults
