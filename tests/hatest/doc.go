//go:build ha

// Package hatest proves that a PostgreSQL failover loses nothing and
// charges nothing twice. It starts a real highly available PostgreSQL on
// loopback — one etcd member and two Patroni-managed PostgreSQL 15 nodes
// with synchronous replication, in a temporary folder, run as the postgres
// user — and two service instances in process that reach it through one
// multi-host DATABASE_URL with target_session_attrs=read-write. Then it
// breaks the primary while the Go client drives load:
//
//   - a SIGKILL of the primary's node (Patroni and its PostgreSQL) in the
//     middle of a create-and-pay storm;
//   - a create held between "COMMIT sent" and "answer read" by a protocol-aware
//     TCP proxy while the primary dies, the unknown commit on purpose;
//   - a planned switchover (patronictl switchover) under load;
//   - a service started while only the replica is reachable.
//
// Every file carries the ha build tag: the suite needs the patroni,
// etcd-server and etcd-client packages and takes a few minutes. Run it with
// `make test-ha`, which installs them when they are missing.
package hatest
