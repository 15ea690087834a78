/*
 * The idempotency protocol of orderservice, as a Promela model for SPIN.
 *
 * One order and one pay intent (an Idempotency-Key), met by everything
 * that brings the intent back, each attempt running the code's three
 * phases on some instance and liable to crash between any two steps or to
 * be too slow for its lease. The channel moves money once per key, may
 * lose its answer or fail a lookup and, like a real acquirer, forgets a
 * key for deduplication once its window has passed, while a lookup by the
 * key still finds the charge. The cleanup removes the record once its
 * retention has passed. Time is only the order in which the windows end.
 *
 * Two configurations, because together they are too many states for CI:
 *   (default)  the replay sources: two clients that retry the intent and
 *              lose answers, a broker that redelivers its command, an
 *              operator who replays its dead letter; the channel answers
 *              at once.
 *   -DORDER    the order: the first request and its retry, the channel
 *              may take the charge on to finish later (202; its webhook is
 *              a hint, the sweeper asks too: ResolvePending, SweepPending),
 *              and a second intent on the order, a cancel, races the pay.
 *   -DREFUND   the cancel of a paid order as the intent: the same three
 *              phases, faults and takeovers, its refund under a stable key
 *              of its own. The channel refunds, fails the refund (it
 *              returned nothing: the order is PAID again), or takes it on
 *              (pending, which proves nothing: the intent is asked again);
 *              a ship races the cancel.
 *   -DORDER -DSECOND  the order's pay, and a second pay with a new key
 *              racing it in place of the cancel.
 * The sweeper runs in all four.
 *
 * What is checked is what a user sees, never the guards themselves: the
 * money (one charge at most), that what the service stored agrees with the
 * money, that the order moves once on the payment's outcome, that every
 * answer given for the intent is the same one, that a stored final answer
 * never changes and is never a 503, and that nothing is left
 * hanging once everything has run (the monitor and rest processes, below).
 * model/README.md maps each part to the code. `make model` checks every
 * configuration, then each variant below (one safeguard removed), and
 * requires SPIN to find the harm in every one:
 *   NO_FENCING              phase 3 writes without holding the record (no fence at all)
 *   CHECK_THEN_INSERT       the claim reads, then inserts, in two steps
 *   NEW_KEY                 each attempt asks the channel under a key of its own
 *   SHORT_RETENTION         records kept for the client's window only, not the chain
 *   NO_LOOKUP               a resumed intent sends its key again without asking first
 *   AGE_ONLY                the key-window check leaves out the channel timeout
 *   LOOKUP_FORGETS          the channel's lookups forget a key with its deduplication
 *   CLEANUP_INFLIGHT        the cleanup removes expired records in any state
 *   TIMEOUT_DECLINES        an answer lost in a timeout is stored as a decline
 *   FAILED_LOOKUP_DECLINES  a failed lookup (a 4xx other than 404) is taken as a decline
 *   CANCEL_WHILE_PENDING    the state machine lets a cancel through in PAYMENT_PENDING
 *   FAIL_UNFENCED           the postpone (Fail) without its fence
 *   TRANSIENT_FINAL         an unknown outcome stored as the final answer, 503
 *   DECIDE_AT_CLAIM         the key window judged at the claim, not at the call
 *   SHIP_WHILE_REFUNDING    (REFUND) the state machine lets a ship through in REFUND_PENDING
 *   PENDING_REFUND_DONE     (REFUND) a refund still pending taken as done
 *   PAY_WHILE_PENDING       (SECOND) the state machine lets a second pay through in PAYMENT_PENDING
 *   NO_SWEEPER              nothing takes over (liveness)
 * and one that must hold: NO_TOKEN, phase 3 checking the record's state
 * but not its token (the payment's own pending guard covers the rest).
 */

/* idempotency_records.state of the pay intent's scope */
#define NONE   0   /* no record */
#define PROC   1   /* PROCESSING: an owner holds the lease */
#define DONE   2   /* SUCCEEDED or FAILED_FINAL: the definitive answer is stored */
#define RETRY  3   /* FAILED_RETRYABLE: the channel's answer is not known */

/* What the channel holds under a key, and what an attempt got from it. */
#define CHARGED  1
#define DECLINED 2
#define PEND     3   /* taken on, to finish later */
#define REFUSED  4   /* got only: a refusal, as final as a decline */
#define UNKNOWN  5   /* got only: no definitive reply */

/* The answer a client is given, and a record stores. */
#define A_PAID     1   /* 200: the order, paid */
#define A_DECLINED 2   /* 402 payment_declined */
#define A_ACCEPTED 3   /* 202: the channel finishes the charge later */
#define A_REFUSED  4   /* 409 / 422: refused (state machine, key ran before, channel) */
#define A_UNAVAIL  5   /* 503: the outcome is not known; try again (never stored) */

/* The order's status */
#define CREATED 0
#define PPEND   1      /* PAYMENT_PENDING */
#define PAID    2
#define PFAIL   3      /* PAYMENT_FAILED */
#define RPEND   4      /* REFUND_PENDING */
#define CANC    5      /* CANCELLED */
#define SHIPD   6      /* SHIPPED */

/* The pay's payment row, written in phase 1 with the claim */
#define P_NONE 0
#define P_PEND 1
#define P_OK   2
#define P_FAIL 3

#define CLIENT  0
#define BROKER  1
#define DLQ     2
#define SWEEPER 3

#define NKEYS 8

#ifndef FAULTS
#define FAULTS 2       /* crashes, slow owners, lost answers and failed lookups, in all */
#endif

/* Trace validation (-DTRACE, tools/tracecheck): the model replays a run the
 * Go code recorded. The verifier is compiled once; at its start it reads
 * the trace named by $TRACE_FILE (a line of six numbers an event, kind and
 * arguments), its first $TRACE_LEN events if that is set, into the arrays
 * below. Each step of the model that
 * the code records is then executable only when it matches the next event
 * (EV), and consumes it (NEXT); the steps the code does not record
 * (crashes, leases running out, time) stay free. The channel's own steps,
 * settling what it took on and forgetting a key, are recorded by the
 * tests' channels where they take them; a run whose channel cannot record
 * one says so in the trace's first line (E_FREE), and that step is free
 * for the run. The run is explained when some path consumes
 * every event: the process explained, at the end, reports it as an
 * assertion violation. Attempts are started as the trace claims (spawner),
 * and faults are not bounded: the trace bounds them. */
#define E_CLAIM    1   /* a: kind (K_*), b: token, c: the answer phase 1 gave (0: on to the channel), d: the recovery point read (PT_*) */
#define E_CALL     2   /* a: token, b: how (1 sent at once, 2 a lookup found it or failed, 3 a lookup found nothing and it was sent), c: the result, d: replayed, e: past the key window */
#define E_LAPSED   3   /* a: token: a lease ran out before the call */
#define E_POSTPONE 4   /* a: token, b: fenced */
#define E_STORE    5   /* a: token, b: the answer stored (0: fenced) */
#define E_LATELOOK 6   /* a: what the late verdict's lookup found */
#define E_LATE     7   /* a: the late verdict applied */
#define E_CANCEL   8   /* a: 1 cancelled, 2 refund started, 3 refused */
#define E_REFUND   9   /* a: 1 refunded (CANCELLED), 2 refused (PAID again) */
#define E_ANSWER  10   /* a: the answer a client of the pay was given, from what was stored */
#define E_CLEANUP 11   /* a: the state of the record the cleanup removed (PROC, DONE, RETRY) */
#define E_SETTLE  12   /* a: the verdict the channel reached on a charge it took on (CHARGED, DECLINED) */
#define E_FORGET  13   /* the channel's key window passed: it no longer deduplicates the key */
#define E_FREE    14   /* not an event: the trace's first line; a: the channel's steps the run did not record (1 settle, 2 forget) */
#define E_PAY2    15   /* another pay key on the order, at its new claim: a: 1 it went on to the channel (its own trace follows it), 2 refused in phase 1 */
#define K_NEW      1
#define K_RESUME   2   /* from FAILED_RETRYABLE */
#define K_TAKEOVER 3   /* from an expired lease */
#define K_REPLAY   4
#define K_SWEEP    5   /* the sweeper's claim, from either */
/* The recovery point a claim reads on the record (recovery_point,
 * migration 009), which the code switches on: a new claim's record is
 * started; a resumed one is at payment_created exactly when phase 1 wrote
 * the payment (the model's payment row, pst), started otherwise; a
 * finished record is only ever replayed. */
#define PT_STARTED  1
#define PT_PAYMENT  2   /* payment_created */
#define PT_FINISHED 3
#ifdef TRACE
#undef FAULTS
#define FAULTS 255
#define NEVMAX 256
hidden byte ek[NEVMAX]; hidden byte ea[NEVMAX]; hidden byte eb[NEVMAX];
hidden byte ec[NEVMAX]; hidden byte ed[NEVMAX]; hidden byte ee[NEVMAX];
hidden short nev = 0;  /* the events to explain: read by load_trace at the start */
hidden byte freeSteps = 0;   /* E_FREE: the channel settles (1), forgets (2) unrecorded */
#define FREE(s)         ((freeSteps & (s)) != 0)
#define OWN(s,cond)     (FREE(s) || (cond))   /* the channel's own step s: free, or matched */
#define OWNNEXT(s)      ti = ti + (FREE(s) -> 0 : 1)   /* consumed when recorded */
#define NEV nev
short ti = 0;          /* the next event to explain */
bool spawning = false; /* an attempt was started for the next claim */
bool everDue = false;  /* the pay's payment has been due for a late verdict */
#define AT(k)           (ti < NEV && ek[ti] == (k))
#define EV1(k,a)        (AT(k) && ea[ti] == (a))
#define EV2(k,a,b)      (EV1(k,a) && eb[ti] == (b))
#define EV3(k,a,b,c)    (EV2(k,a,b) && ec[ti] == (c))
#define EV4(k,a,b,c,d)  (EV3(k,a,b,c) && ed[ti] == (d))
#define POINT(p)        (ed[ti] == (p))   /* the claim read recovery point p */
#define NEXT            ti++
#define CLAIMED         ti++; spawning = false
#else
#define AT(k)           true
#define EV1(k,a)        true
#define EV2(k,a,b)      true
#define EV3(k,a,b,c)    true
#define EV4(k,a,b,c,d)  true
#define POINT(p)        true
#define NEXT            skip
#define CLAIMED         skip
#endif

#ifdef NEW_KEY
#define KEYOF(m) (m)   /* a key per attempt */
#else
#define KEYOF(m) 0     /* the intent's stable key */
#endif

/* The key-window check on a resumed intent, read at its claim: its age
 * plus a channel timeout (aged), so that even a slow call lands within the
 * channel's window. AGE_ONLY compares the age alone: it asks first only
 * once the window has passed (forgot), and a claim just short of it (aged,
 * not forgot) sends, its call landing past the window. */
#ifdef AGE_ONLY
#define PAST_WINDOW forgot
#define AT_THE_CALL false
#define LATE_CLAIM  if :: aged -> resumed = 2; late++ :: else -> skip fi
#define LATE_CALLED if :: resumed == 2 -> late-- :: else -> skip fi
#define QUIET       (calling == late)   /* the window may pass during a late claim's call */
#elif defined(DECIDE_AT_CLAIM)
/* The key window judged at the claim, as the code did before atTheCall: an
 * owner may stall for any time between its claim and its call. */
#define PAST_WINDOW aged
#define AT_THE_CALL false
#define LATE_CLAIM  skip
#define LATE_CALLED skip
#define QUIET       true
#else
/* The key window judged at the call (atTheCall, keywindow.go), from the
 * call's deadline: aged then means that the window ends before the
 * deadline (less a margin), and a call cannot outlive its deadline, so the
 * channel forgets whenever it likes: never during a call judged in time. */
#define PAST_WINDOW false
#ifdef TRACE
#define AT_THE_CALL (AT(E_CALL) && ee[ti] == 1)   /* the trace's deadline and window say */
#else
#define AT_THE_CALL aged
#endif
#define LATE_CLAIM  skip
#define LATE_CALLED skip
#define QUIET       true
#endif

#ifdef ORDER
#define WEBHOOK hint = true   /* the channel tells every outcome */
#else
#define WEBHOOK skip
#endif

/* What the intent's money is, and what its outcomes mean. A pay charges:
 * its payment is PAYMENT_PENDING until the charge's outcome, and a charge
 * taken on is an answer (202). A cancel of a paid order refunds: the
 * order is REFUND_PENDING until the refund's outcome, which cancels it
 * (200) or, the refund failed or refused, puts it back to PAID (409
 * refund_refused); a refund still pending proves nothing, and the intent
 * is asked again (refundReply, reply.go). */
#ifdef REFUND
#define MOVE            refunds++         /* the channel moved the money back */
#define MOVED           refunds
#define MOVING          RPEND
#define UNSURE(g)       ((g) == UNKNOWN || (g) == PEND)
#define ANSWER_OF(g)    ((g) == CHARGED -> A_PAID : A_REFUSED)
#define FAILED_ANS      A_REFUSED
#define PAYS_FROM       (ost == PAID)
#define PAID_BEFORE     ost = PAID; charges = 1   /* a pay intent charged the order and ended */
/* Asked again while the refund is pending, the channel says the same, and
 * the sweeper waits longer each time (askAgainAfter doubles): it asks at
 * most twice before the channel settles, which bounds the model's tokens
 * without hiding a takeover while the refund is pending. */
#define ASKED_PENDING   if :: got == PEND && asked < 2 -> asked++ :: else -> skip fi
#define SWEEP_NOW       (pendings == 0 || asked < 2)
#else
#define ASKED_PENDING   skip
#define SWEEP_NOW       true
#define MOVE            charges++
#define MOVED           charges
#define MOVING          PPEND
#define UNSURE(g)       ((g) == UNKNOWN)
#define ANSWER_OF(g)    ((g) == CHARGED -> A_PAID : ((g) == DECLINED -> A_DECLINED : A_REFUSED))
#define FAILED_ANS      A_DECLINED
#define PAYS_FROM       (ost == CREATED || ost == PFAIL)
#define PAID_BEFORE     skip
#endif

/* The variants that take an outcome that is not known as one. */
#if defined(TRANSIENT_FINAL)
#define TAKEN_AS_KNOWN(g) ((g) == UNKNOWN)
#elif defined(PENDING_REFUND_DONE)
#define TAKEN_AS_KNOWN(g) ((g) == PEND)
#else
#define TAKEN_AS_KNOWN(g) false
#endif
#if defined(ORDER) || defined(REFUND)
#define TAKES_ON 1     /* the channel may take the request on, to finish later */
#endif

#ifdef LOOKUP_FORGETS
#define FINDS(k) (ledger[k] != 0 && (known & (1 << (k))) != 0)
#else
#define FINDS(k) (ledger[k] != 0)   /* a lookup outlives the key's deduplication */
#endif

byte rec = NONE;       /* the record's state */
byte token = 0;        /* lease_token: the fencing token */
bool expired = false;  /* the owner's lease has run out */
byte stored = 0;       /* the answer the record stores (phase 3, or a phase-1 refusal) */
bool aged = false;     /* the intent is older than the channel's key window, less a channel timeout */
bool forgot = false;   /* the channel's window passed: it forgot the keys it knew */
byte calling = 0;      /* owners between their claim and their call */
byte late = 0;         /* AGE_ONLY: of those, resumed ones that claimed when the intent had aged */
byte faults = 0;

byte ost = CREATED;    /* orders.status (REFUND: PAID, set by init) */
byte pst = P_NONE;     /* payments.status of the pay's payment */
byte pkey = 0;         /* payments.channel_key: the key phase 1 stored */
byte moves = 0;        /* the order's moves on the payment's outcome */

byte ledger[NKEYS];    /* the channel's charge under each key: 0, CHARGED, DECLINED, PEND */
byte known = 0;        /* the keys the channel still deduplicates (a bit each) */
byte old = 0;          /* the keys it knew when the intent aged: those it may forget */
byte pendings = 0;     /* charges the channel took on and has not settled */
bool hint = false;     /* a webhook is on its way */
byte charges = 0;      /* money the channel took */
byte refunds = 0;      /* money the channel gave back */
byte charges2 = 0;     /* SECOND: money a second pay, under a new key, took */
byte asked = 0;        /* REFUND: the answers "still pending" the intent was given, up to 2 */

byte final = 0;        /* the first final answer stored (not a 202) */
byte told = 0;         /* the first answer a client of the intent was given */
byte given = 0;        /* every answer given, one bit each */

/* The windows end in this order (the configuration check makes it so):
 * 0 all open; 1 the client's retry window ended; 2 the redelivery window
 * ended (the chain client retry + redelivery); 3 the horizon passed (an
 * older dead letter is refused); 4 the retention passed (the cleanup may
 * remove the record). */
byte clock = 0;

/* A client of the intent is given an answer: the replay check records it. */
inline tell(a) {
	if
	:: told == 0 -> told = a
	:: else -> skip
	fi;
	given = given | (1 << a)
}

/* A final answer is stored: the first is remembered. */
#define FINAL(a) if :: final == 0 && (a) != A_ACCEPTED -> final = (a) :: else -> skip fi

/* An attempt from src arrives: or does not, once its window has ended. */
inline arrive(src) {
#ifdef TRACE
	skip   /* a test's client comes when it likes */
#else
	if
	:: src == CLIENT && clock >= 1 -> goto gone
	:: src == BROKER && clock >= 2 -> goto gone
	:: src == DLQ && clock >= 3 -> goto gone
	:: else -> skip
	fi
#endif
}

/* The intent ends in phase 1 with a refusal, stored and told. */
inline refuse() {
	rec = DONE; stored = A_REFUSED; FINAL(A_REFUSED); tell(A_REFUSED); goto gone
}

/* Phase 1 of a new claim: the order's rule, in the claim's transaction.
 * A payment under the scope means the key moved money before and its
 * record is gone: refused (errKeyRanBefore). Otherwise the order pays
 * from CREATED or PAYMENT_FAILED (REFUND: is refunded from PAID), writing
 * the pending payment with the key; from anything else the state machine
 * refuses. */
inline rule(mine) {
	if
	:: pst != P_NONE -> refuse()
	:: pst == P_NONE && PAYS_FROM ->
		ost = MOVING; pst = P_PEND; pkey = KEYOF(mine); calling++
	:: pst == P_NONE && !PAYS_FROM -> refuse()
	fi
}

/* What the order's rule answers a new claim: 0 when it goes on. */
#define RULE_ANS ((pst == P_NONE && PAYS_FROM) -> 0 : A_REFUSED)

/* The channel is sent a charge under key: it answers from its record of
 * the key while it remembers it, or acts: charges, declines, or takes the
 * charge on to finish later. */
#ifndef TRACE
inline send(key, got) {
	if
	:: (known & (1 << key)) != 0 -> got = ledger[key]      /* replayed */
	:: else ->
		known = known | (1 << key);
		if
		:: ledger[key] = CHARGED; MOVE; WEBHOOK
		:: ledger[key] = DECLINED; WEBHOOK
#ifdef TAKES_ON
		:: ledger[key] = PEND; pendings++
#endif
		fi;
		got = ledger[key]
	fi
}
#else
/* The same, each outcome matched with the call recorded (how: 1 sent at
 * once, 3 after a lookup that found nothing). The channel may also lose
 * its answer once it acted, be unavailable and do nothing, or refuse the
 * request (a 4xx): the code's trace tells which it saw, UNKNOWN for both
 * of the first two. */
#define HOW (lookup -> 3 : 1)
inline send(key, got) {
	if
	:: (known & (1 << key)) != 0 && EV4(E_CALL, mine, HOW, ledger[key], 1) -> NEXT; got = ledger[key]
	:: (known & (1 << key)) != 0 && EV3(E_CALL, mine, HOW, UNKNOWN) -> NEXT; got = UNKNOWN
	:: (known & (1 << key)) == 0 && EV3(E_CALL, mine, HOW, UNKNOWN) -> NEXT; got = UNKNOWN   /* unavailable */
	:: (known & (1 << key)) == 0 && EV4(E_CALL, mine, HOW, REFUSED, 0) -> NEXT; got = REFUSED
	:: (known & (1 << key)) == 0 && AT(E_CALL) && ea[ti] == mine && eb[ti] == HOW && ed[ti] == 0 &&
	   (ec[ti] == CHARGED || ec[ti] == DECLINED || ec[ti] == PEND || ec[ti] == UNKNOWN) ->
		known = known | (1 << key);
		if
		:: ec[ti] == CHARGED || ec[ti] == UNKNOWN -> ledger[key] = CHARGED; MOVE
		:: ec[ti] == DECLINED || ec[ti] == UNKNOWN -> ledger[key] = DECLINED
		:: ec[ti] == PEND || ec[ti] == UNKNOWN -> ledger[key] = PEND; pendings++
		fi;
		got = ec[ti]; NEXT   /* UNKNOWN: it acted, and the answer was lost */
	fi
}
#endif

/* The order moves on the payment's outcome (moveOnReply), once: only a
 * payment still pending takes an outcome, and only PAYMENT_PENDING
 * (REFUND_PENDING) may move; otherwise the transaction stores nothing. */
inline settle(got) {
	if
#ifdef REFUND
	:: got == CHARGED -> pst = P_OK; ost = CANC
	:: else -> pst = P_FAIL; ost = PAID
#else
	:: got == CHARGED -> pst = P_OK; ost = PAID
	:: else -> pst = P_FAIL; ost = PFAIL
#endif
	fi;
	moves++
}

/* The intent's owner lets its record go to FAILED_RETRYABLE, fenced. */
inline postpone(mine) {
	if
#ifdef FAIL_UNFENCED
	:: rec != NONE -> rec = RETRY      /* Fail without its lease_token = ? AND state = 'PROCESSING' */
	:: rec == NONE -> skip
#endif
	:: rec == PROC && token == mine && EV2(E_POSTPONE, mine, 0) -> NEXT; rec = RETRY
	:: !(rec == PROC && token == mine) && EV2(E_POSTPONE, mine, 1) -> NEXT   /* fenced */
	fi
}

/* What phase 3 stores, as it decides it below: 0 when the transition is
 * refused (rolled back). */
#define STORE_ANS (pst == P_PEND && got == PEND -> A_ACCEPTED : \
	(pst == P_PEND && ost == MOVING -> ANSWER_OF(got) : \
	(pst == P_OK -> A_PAID : (pst == P_FAIL -> FAILED_ANS : 0))))

/* One attempt of the intent, from src, through the three phases. */
inline attempt(src, mine, lookup, resumed, got, ans) {
	/* Phase 1: claim by unique insert; or replay, 409, resume, take over.
	 * Arriving and claiming are one step: the retention's margin covers
	 * the work in flight between them. */
#ifdef CHECK_THEN_INSERT
	atomic {
		arrive(src);
		if
		:: src != SWEEPER && rec == NONE -> skip   /* seen absent ... */
		:: else -> goto claimed
		fi
	}
	atomic { rec = PROC; token = 1; mine = 1; expired = false; rule(mine) };  /* ... inserted */
	goto open;
claimed:
#endif
	atomic {
		arrive(src);
		if
		:: src != SWEEPER && rec == NONE && EV4(E_CLAIM, K_NEW, 1, RULE_ANS, PT_STARTED) ->   /* first */
			CLAIMED; rec = PROC; token = 1; mine = 1; expired = false; rule(mine)
		:: src != SWEEPER && rec == DONE && EV4(E_CLAIM, K_REPLAY, 0, stored, PT_FINISHED) ->  /* replay */
			CLAIMED; tell(stored); goto gone
		:: (rec == RETRY || (rec == PROC && expired)) &&
		   EV2(E_CLAIM, (src == SWEEPER -> K_SWEEP : (rec == RETRY -> K_RESUME : K_TAKEOVER)), token + 1) &&
		   POINT(pst != P_NONE -> PT_PAYMENT : PT_STARTED) ->  /* resume, where the payment row says */
			/* its owner died, or the intent is past the channel's key window: ask first */
			CLAIMED; resumed = 1; lookup = (rec == PROC || PAST_WINDOW);
			rec = PROC; token++; mine = token; expired = false; calling++;
			LATE_CLAIM
		:: else -> goto gone      /* 409 in flight; nothing for the sweeper */
		fi
	}
open:
	if
	:: atomic { faults < FAULTS -> faults++; calling--; LATE_CALLED;   /* crash: the lease runs out */
		if :: rec == PROC && token == mine -> expired = true :: else -> skip fi };
		goto gone
	:: skip
	fi;

#ifdef TRACE
	/* An owner whose lease ran out before its call does not call
	 * (leaseLapsed): it gives the intent back, fenced. */
	if
	:: atomic { (expired || token != mine) && EV1(E_LAPSED, mine) -> NEXT; calling--; LATE_CALLED };
		atomic { postpone(mine) }; goto gone
	:: skip
	fi;
#endif

	/* Phase 2: ask the channel under the payment's key. The sweeper, a
	 * takeover from an owner that died, and an intent resumed past the
	 * channel's key window (decided at the claim) ask what the channel
	 * holds first. */
	atomic {
#ifndef NO_LOOKUP
		/* the key window judged at the call, from the call's deadline */
		lookup = lookup || src == SWEEPER || AT_THE_CALL;
#else
		lookup = false;
#endif
		if
		:: lookup && faults < FAULTS && EV3(E_CALL, mine, 2, UNKNOWN) -> NEXT; faults++;     /* the lookup fails: a 4xx other than 404 */
#ifdef FAILED_LOOKUP_DECLINES
			got = REFUSED
#else
			got = UNKNOWN      /* says nothing of the charge */
#endif
		:: lookup && FINDS(KEYOF(mine)) && EV4(E_CALL, mine, 2, ledger[KEYOF(mine)], 0) -> NEXT; got = ledger[KEYOF(mine)]
		:: !lookup || !FINDS(KEYOF(mine)) -> send(KEYOF(mine), got)
		fi;
		calling--; LATE_CALLED
	}
	if
#ifdef TRANSIENT_FINAL
	:: got == UNKNOWN -> atomic { rec == PROC && token == mine -> rec = DONE; stored = A_UNAVAIL; tell(A_UNAVAIL) }; goto gone   /* a 503 stored as final */
#endif
#ifdef PENDING_REFUND_DONE
	:: got == PEND -> got = CHARGED      /* a refund still pending taken as done */
#endif
	:: UNSURE(got) && !TAKEN_AS_KNOWN(got) -> atomic { ASKED_PENDING; postpone(mine) }; goto gone
	:: else -> skip
	fi;
	if
	:: atomic { faults < FAULTS -> faults++;     /* crash after the call */
		if :: rec == PROC && token == mine -> expired = true :: else -> skip fi };
		goto gone
#ifndef TRACE
	:: atomic { faults < FAULTS -> faults++;     /* the answer is lost: outcome unknown */
#ifdef TIMEOUT_DECLINES
		got = DECLINED };                        /* ... and taken as a decline */
#else
		postpone(mine) };
		goto gone
#endif
#else
	:: atomic { postpone(mine) }; goto gone   /* the answer could not be stored: given back */
#endif
	:: skip
	fi;

	/* Phase 3: hold the record (the fence), store the reply on the payment
	 * while it is pending and move the order, complete the record. */
	atomic {
		if
#ifdef NO_FENCING
		:: rec != NONE ->
#elif defined(NO_TOKEN)
		:: rec == PROC ->        /* the state checked, the token not: this holds */
#else
		:: rec == PROC && token == mine && (STORE_ANS == 0 || EV2(E_STORE, mine, STORE_ANS)) ->
#endif
			if
			:: pst == P_PEND && got == PEND -> ans = A_ACCEPTED
			:: pst == P_PEND && got != PEND && ost == MOVING ->
				settle(got); ans = ANSWER_OF(got)
			:: pst == P_OK -> ans = A_PAID          /* its outcome came in another way first */
			:: pst == P_FAIL -> ans = FAILED_ANS
			:: else -> ans = 0                       /* the transition is refused: rolled back */
			fi;
			if
			:: ans != 0 ->
				NEXT; rec = DONE; stored = ans; FINAL(ans);
				if :: src != SWEEPER -> tell(ans) :: else -> skip fi
			:: else -> expired = true                /* an error: left to the lease */
			fi
		:: !(rec == PROC && token == mine) && EV2(E_STORE, mine, 0) -> NEXT   /* fenced: its successor answers */
		fi
	}
gone:
	atomic { mine = 0; lookup = false; resumed = 0; got = 0; ans = 0 }
}

proctype request(byte src) {
	byte mine, got, ans; bool lookup; byte resumed;
	attempt(src, mine, lookup, resumed, got, ans)
}

/* A late outcome is due: the payment is pending, its intent has ended (its
 * record is definitive, or gone), and the channel has the outcome. Asking
 * while the channel has nothing final changes nothing, and is left out:
 * so a payment nobody can finish shows at rest. */
#ifndef TRACE
#define LATE_DUE (pst == P_PEND && (rec == DONE || rec == NONE) && \
	(ledger[pkey] == CHARGED || ledger[pkey] == DECLINED) && FINDS(pkey))
#else
/* The code reads that the payment is due (waitingForChannel), then asks the
 * channel, in two steps: a lookup may come after another late verdict
 * stored the outcome, if it read the payment due before that. So in trace
 * mode a late lookup needs the payment to have been due at some point
 * (everDue), and it asks whatever the channel holds. */
#define LATE_DUE (everDue && AT(E_LATELOOK))
#endif

/* ResolvePending, after waitingForChannel found the payment due: the
 * channel is asked by the key (lookUpOnly), then one transaction stores
 * the outcome if the payment is still pending. */
inline lateLookup(got) {
	if
	:: faults < FAULTS && EV1(E_LATELOOK, UNKNOWN) -> CLAIMED; faults++;     /* the lookup fails */
#ifdef FAILED_LOOKUP_DECLINES
		got = REFUSED
#else
		got = UNKNOWN                   /* errChannelUnknown: asked again later */
#endif
	:: EV1(E_LATELOOK, ledger[pkey]) -> CLAIMED; got = ledger[pkey]
	fi
}
inline lateStore(got) {
	atomic {
#ifndef TRACE
		if
		:: pst == P_PEND && ost == PPEND && got != 0 && got != UNKNOWN -> settle(got)
		:: else -> skip                 /* stored already, or unknown */
		fi;
#else
		if
		:: pst == P_PEND && ost == PPEND && (got == CHARGED || got == DECLINED) && EV1(E_LATE, 1) -> NEXT; settle(got)
		:: !(pst == P_PEND && ost == PPEND && (got == CHARGED || got == DECLINED)) && got != UNKNOWN && EV1(E_LATE, 0) -> NEXT
		:: got == UNKNOWN -> skip       /* errChannelUnknown: no transaction */
		fi;
#endif
		got = 0
	}
}

/* The sweeper: takes over expired leases and retryable intents (Sweep),
 * and asks the channel about payments whose intent ended pending
 * (SweepPending), for as long as the service runs. */
active proctype sweeper() {
	byte mine, got, ans; bool lookup; byte resumed;
end:
	do
#if !defined(NO_SWEEPER) && !defined(TRACE)
	:: (rec == RETRY || (rec == PROC && expired)) && SWEEP_NOW -> attempt(SWEEPER, mine, lookup, resumed, got, ans)
#endif
#ifndef TRACE
	:: atomic { LATE_DUE -> lateLookup(got) }; lateStore(got)
#else
	:: false   /* in trace mode late verdicts start as the trace asks (lateVerdict) */
#endif
	od
}

#ifdef ORDER
/* The channel's webhook: a hint that an outcome exists, delivered late or
 * never; its receiver asks the channel (ResolvePending). */
active proctype webhook() {
	byte got;
end:
	do
#ifndef TRACE
	:: atomic { hint -> hint = false;
		if
		:: LATE_DUE -> lateLookup(got)
		:: else -> skip               /* ignored: the intent runs, or stored already */
		fi };
		lateStore(got)
	:: atomic { hint -> hint = false }  /* lost */
#else
	:: false   /* in trace mode late verdicts start as the trace asks (lateVerdict) */
#endif
	od
}
#endif

#ifdef TAKES_ON
/* The channel settles what it took on: charged or declined (REFUND: the
 * refund succeeded or failed). */
#ifndef TRACE
active proctype channel() {
	byte k;
end:
	do
	:: atomic { pendings > 0 ->
		k = 0;
		do
		:: ledger[k] != PEND -> k++
		:: else -> break
		od;
		if
		:: ledger[k] = CHARGED; MOVE
		:: ledger[k] = DECLINED
		fi;
		pendings--; WEBHOOK; k = 0 }
	od
}
#else
/* In trace mode a settle is a recorded step of the channel's own
 * (E_SETTLE): the channel settles only when the run says so, with the
 * verdict recorded; free only in a run whose channel settles unrecorded. */
active proctype channel() {
	byte k;
end:
	do
	:: atomic { pendings > 0 && OWN(1, AT(E_SETTLE)) ->
		k = 0;
		do
		:: ledger[k] != PEND -> k++
		:: else -> break
		od;
		if
		:: OWN(1, EV1(E_SETTLE, CHARGED)) -> ledger[k] = CHARGED; MOVE
		:: OWN(1, EV1(E_SETTLE, DECLINED)) -> ledger[k] = DECLINED
		fi;
		OWNNEXT(1); pendings--; WEBHOOK; k = 0 }
	od
}
#endif

#endif

/* An owner too slow for its lease loses its right (a fault). */
active proctype leases() {
end:
	do
	:: atomic { rec == PROC && !expired && faults < FAULTS -> faults++; expired = true }
	od
}

/* Time: the windows end one after another. The intent grows older than
 * the channel's key window (less a channel timeout) at some point after
 * it was claimed; only then may the channel forget the keys it knew at
 * that point (their first use came after the claim), once, never while an
 * owner is between its claim and its call (that takes a channel timeout,
 * a key window is a day), nor a charge it has not settled. With AGE_ONLY
 * the check leaves the channel timeout out, and the window may pass
 * during the call. In trace mode the forgetting is a recorded step of the
 * channel's own (E_FORGET), taken only when the run says so (free only in
 * a run whose channel forgets unrecorded), and then the channel must have
 * known the pay's key when the intent aged: the recorded step forgets it,
 * where a free one may forget nothing. The ageing stays free. */
active proctype time() {
	do
	:: clock < 4 -> clock++
	:: atomic { rec != NONE && !aged -> aged = true; old = known }
#ifndef TRACE
	:: atomic { aged && !forgot && QUIET && pendings == 0 -> forgot = true; known = known & ~old }
#else
	:: atomic { aged && !forgot && QUIET && pendings == 0 && OWN(2, AT(E_FORGET) && (old & (1 << pkey)) != 0) ->
		OWNNEXT(2); forgot = true; known = known & ~old }   /* a recorded forgetting forgets the pay's key */
#endif
	:: clock == 4 -> break
	od
}

/* The cleanup removes a finished record once its retention has passed.
 * In trace mode each removal is a recorded step (idempotency.Store.Removed),
 * naming the state the record had: it is taken as often as the code took
 * it, and only under the same guard, so a removal the guard forbids (a
 * record in flight) is an event no path explains. */
#ifdef CLEANUP_INFLIGHT
#define CLEANABLE (rec != NONE)   /* whatever its state */
#else
#define CLEANABLE (rec == DONE)
#endif
#ifdef TRACE
active proctype cleanup() {
end:
	do
	:: atomic { clock >= 4 && CLEANABLE && EV1(E_CLEANUP, rec) -> NEXT; rec = NONE }
	od
}
#else
active proctype cleanup() {
end:
	atomic {
#ifdef SHORT_RETENTION
		clock >= 1 &&          /* kept for the client's window only */
#else
		clock >= 4 &&
#endif
		CLEANABLE -> rec = NONE
	}
}
#endif

#ifdef ORDER
/* A second intent on the same order: a cancel, while its client is there.
 * An unpaid order is cancelled at once; a paid one is refunded first
 * (REFUND_PENDING); in PAYMENT_PENDING the money may be moving, and the
 * state machine refuses (409). Here the cancel is one step: its refund,
 * with its own faults and takeovers, is the intent of -DREFUND. */
#ifdef TRACE
proctype cancel() {
	bool refund = false;
	atomic {
		if
		:: (ost == CREATED || ost == PFAIL) && EV1(E_CANCEL, 1) -> CLAIMED; ost = CANC
		:: ost == PAID && EV1(E_CANCEL, 2) -> CLAIMED; ost = RPEND; refund = true
		:: !(ost == CREATED || ost == PFAIL || ost == PAID) && EV1(E_CANCEL, 3) -> CLAIMED
		fi
	}
	if
	:: refund -> atomic {
		if
		:: EV1(E_REFUND, 1) -> NEXT; refunds++; ost = CANC
		:: EV1(E_REFUND, 2) -> NEXT; ost = PAID    /* the channel refused the refund */
		fi; refund = false }
	:: else -> skip
	fi
}
#else
proctype cancel() {
	bool refund = false;
	atomic {
		if
		:: clock >= 1 -> skip  /* it never came */
		:: else ->
			if
			:: ost == CREATED || ost == PFAIL -> ost = CANC
#ifdef CANCEL_WHILE_PENDING
			:: ost == PPEND -> ost = CANC
#endif
			:: ost == PAID -> ost = RPEND; refund = true
			:: else -> skip    /* 409 invalid_transition */
			fi
		fi
	}
	if
	:: refund -> atomic {
		if
		:: refunds++; ost = CANC
		:: ost = PAID            /* the channel refused the refund: PAID again */
		fi; refund = false }
	:: else -> skip
	fi
}
#endif

#endif

#if defined(SECOND) && !defined(TRACE)
/* A second pay with a new key races the first: its client pays again with
 * a key of its own (a new intent: a new record, a new payment, a new
 * channel key). Its own phases and faults are the pay's, checked on the
 * first; here it is its rule, then its outcome. The state machine lets it
 * pay from CREATED or PAYMENT_FAILED only: while the first pay's money
 * may be moving (PAYMENT_PENDING) it is refused (409), and once the order
 * is PAID too. */
proctype pay2() {
	bool paying = false;
	atomic {
		if
		:: clock >= 1 -> skip  /* it never came */
		:: else ->
			if
			:: PAYS_FROM -> ost = PPEND; paying = true
#ifdef PAY_WHILE_PENDING
			:: ost == PPEND -> paying = true
#endif
			:: else -> skip    /* 409 invalid_transition */
			fi
		fi
	}
	if
	:: paying -> atomic {
		if
		:: charges2++; ost = PAID    /* charged under its own key */
		:: ost = PFAIL               /* declined */
		fi; paying = false }
	:: else -> skip
	fi
}
#endif

#if defined(REFUND) && !defined(TRACE)
/* A different intent on the order races the cancel: a ship, while its
 * client is there. The state machine ships a PAID order only: a cancelled
 * order cannot ship, and an order being refunded neither (409). */
proctype ship() {
	atomic {
		if
		:: clock >= 1 -> skip  /* it never came */
		:: else ->
			if
			:: ost == PAID -> ost = SHIPD
#ifdef SHIP_WHILE_REFUNDING
			:: ost == RPEND -> ost = SHIPD
#endif
			:: else -> skip    /* 409 invalid_transition */
			fi
		fi
	}
}
#endif

#ifdef TRACE
/* Attempts start as the trace claims: one at a time, each taking the next
 * claim (or the cancel). */
active proctype spawner() {
end:
	do
	:: atomic { AT(E_CLAIM) && !spawning -> spawning = true;
		if
		:: ea[ti] == K_SWEEP -> run request(SWEEPER)
		:: else -> run request(CLIENT)
		fi }
#ifdef ORDER
	:: atomic { AT(E_CANCEL) && !spawning -> spawning = true; run cancel() }
#endif
	:: atomic { AT(E_LATELOOK) && !spawning -> spawning = true; run lateVerdict() }
	:: atomic { !everDue && pst == P_PEND && (rec == DONE || rec == NONE) -> everDue = true }
	:: atomic { AT(E_ANSWER) && (given & (1 << ea[ti])) != 0 -> NEXT }   /* an answer the model told */
#ifdef ORDER
	/* Another pay key (-DSECOND's pay2, as the code records it): its rule
	 * lets it pay only from CREATED or PAYMENT_FAILED, and then the order
	 * is its own (PAYMENT_PENDING under its payment, which its own trace
	 * follows); anywhere else it is refused. */
	:: atomic { EV1(E_PAY2, 1) && PAYS_FROM -> NEXT; ost = PPEND }
	:: atomic { EV1(E_PAY2, 2) && !PAYS_FROM -> NEXT }
#endif
	od
}

/* A late verdict (a webhook, ResolvePending, SweepPending): as many at once
 * as the run had. */
proctype lateVerdict() {
	byte got;
	atomic { LATE_DUE -> lateLookup(got) }; lateStore(got)
}

/* Every event explained: reported as a violation, with the path as its trail. */
proctype explained() {
	ti == NEV -> assert(ti != NEV)   /* the trace is explained */
}

c_code {
/* Reads the trace into the hidden arrays, once. */
void load_trace(void) {
	static int loaded;
	const char *path = getenv("TRACE_FILE"), *len = getenv("TRACE_LEN");
	int k, a, b, c, d, e, max = len ? atoi(len) : NEVMAX;
	FILE *f;
	if (loaded) return;
	loaded = 1;
	if (!path || !(f = fopen(path, "r"))) { printf("tracecheck: no TRACE_FILE\n"); exit(2); }
	while (nev < max && nev < NEVMAX && fscanf(f, "%d %d %d %d %d %d", &k, &a, &b, &c, &d, &e) == 6) {
		if (k == E_FREE) { freeSteps = a; continue; }   /* the run's unrecorded steps: no event */
		ek[nev] = k; ea[nev] = a; eb[nev] = b; ec[nev] = c; ed[nev] = d; ee[nev] = e; nev++;
	}
	fclose(f);
}
}
#else
/* What a user cares about, checked in every state. */
active proctype monitor() {
end:
	atomic {
		charges + charges2 > 1 || moves > 1 || (given & ~(1 << told)) != 0 ||
		(rec == DONE && stored == A_PAID && MOVED == 0) ||
		(rec == DONE && (stored == A_DECLINED || stored == A_REFUSED) && MOVED > 0) ||
		(pst == P_OK && MOVED == 0) || (pst == P_FAIL && MOVED > 0) ||
		((ost == CANC || ost == PFAIL || ost == CREATED) && charges + charges2 != refunds) ||
		((ost == PAID || ost == SHIPD) && refunds > 0) || refunds > charges + charges2 ||
		(final != 0 && (rec == PROC || rec == RETRY || (rec == DONE && stored != final))) ||
		(rec == DONE && stored == A_UNAVAIL) ->
		assert(charges + charges2 <= 1);            /* never two charges for one order, whatever keys pay it */
		assert(refunds <= charges + charges2);      /* never more given back than was taken: one refund at most */
		assert(!(rec == DONE && stored == A_PAID && MOVED == 0));    /* a stored 200 means the money moved */
		assert(!(rec == DONE && (stored == A_DECLINED || stored == A_REFUSED) && MOVED > 0));  /* a stored 402 or 409 means no money moved */
		assert(!(pst == P_OK && MOVED == 0) && !(pst == P_FAIL && MOVED > 0));  /* the order's payment agrees with the money */
		assert(ost == PAID || ost == PPEND || ost == RPEND || ost == SHIPD || charges + charges2 == refunds);  /* an order that is not paid holds no money */
		assert(!((ost == PAID || ost == SHIPD) && refunds > 0));  /* a paid or shipped order holds its money */
		assert(moves <= 1);                          /* the order moves once on the payment's outcome */
		assert((given & ~(1 << told)) == 0);         /* every answer given is the first one */
		assert(!(final != 0 && (rec == PROC || rec == RETRY || (rec == DONE && stored != final))));  /* a stored final answer never changes */
		assert(!(rec == DONE && stored == A_UNAVAIL))   /* a stored 503 is never final: a retry must learn the outcome */
	}
}

#endif

#if !defined(LIVENESS) && !defined(TRACE)
/* Once nothing can run any more, nothing is left hanging: the order is not
 * waiting for a payment or a refund that nobody will finish. */
active proctype rest() {
	timeout -> assert(ost != PPEND && ost != RPEND)   /* at rest, no order is left pending */
}
#endif

init {
#ifdef TRACE
	atomic { c_code { load_trace(); }; PAID_BEFORE; run explained() }
#else
	atomic {
		PAID_BEFORE;
		run request(CLIENT);   /* the first request */
		run request(CLIENT);   /* its retry, on another instance */
#ifdef REFUND
		run ship()             /* a different intent on the order */
#elif defined(SECOND)
		run pay2()             /* a second pay, with a new key */
#elif defined(ORDER)
		run cancel()           /* a second intent on the order */
#else
		run request(BROKER);   /* the same intent as a command, redelivered */
		run request(DLQ)       /* its dead letter, replayed by an operator */
#endif
	}
#endif
}

/* Liveness, under weak fairness: an intent begun ends definitive, and the
 * order does not stay in PAYMENT_PENDING (REFUND: REFUND_PENDING). */
#ifndef TRACE
ltl converges { [] (((rec == PROC || rec == RETRY) -> <> (rec == DONE)) && (ost == MOVING -> <> (ost != MOVING))) }
#endif
