/*
 * The idempotency protocol of orderservice, as a Promela model for SPIN.
 *
 * One intent (a pay, with its Idempotency-Key), and every way the real
 * service meets it again: two clients that retry it and lose answers, a
 * broker that redelivers its command, an operator who replays its dead
 * letter, and the sweeper that takes over what is left. Each attempt runs
 * the code's three phases on some instance and may crash between any two
 * steps or be too slow for its lease; the channel moves money once per key
 * and may lose its answer, and (like a real acquirer) forgets a key once
 * its own window has passed, keeping its charges; the cleanup removes the
 * record once its retention has passed. Time is only the order in which
 * the windows end.
 *
 * model/README.md maps each part to the code. `make model` checks this
 * model, then each variant below (one safeguard removed), and requires SPIN
 * to find the harm in every variant:
 *   NO_FENCING         phase 3 writes without checking the lease token
 *   CHECK_THEN_INSERT  the claim reads, then inserts, in two steps
 *   NEW_KEY            each attempt asks the channel under a key of its own
 *   SHORT_RETENTION    records kept for the client's window only, not the chain
 *   NO_LOOKUP          a resumed intent sends its key again without asking first
 */

#define NONE   0   /* no record */
#define PROC   1   /* PROCESSING: an owner holds the lease */
#define DONE   2   /* SUCCEEDED: the definitive answer is stored */
#define RETRY  3   /* FAILED_RETRYABLE: the channel's answer is not known */

#define CHARGED  1
#define DECLINED 2

#define CLIENT  0
#define BROKER  1
#define DLQ     2
#define SWEEPER 3

#ifndef FAULTS
#define FAULTS 2       /* crashes, slow owners and lost answers, in all */
#endif

byte rec = NONE;       /* idempotency_records.state of the intent's scope */
byte token = 0;        /* idempotency_records.lease_token: the fencing token */
bool expired = false;  /* the owner's lease has run out */
bool removed = false;  /* the cleanup removed the record */
bool aged = false;     /* the record is older than the channel's key window */
bool forgot = false;   /* the channel no longer knows the intent's key */
byte effects = 0;      /* phase-1 writes: the transition and the pending payment */
byte charges = 0;      /* money the channel moved */
byte ledger[8];        /* the channel's answer by key (0 none, CHARGED, DECLINED): a lookup finds it */
byte stored = 0;       /* the answer stored in the record (phase 3) */
byte answered = 0;     /* the first answer a client received */
byte faults = 0;
byte calling = 0;      /* owners between their claim and their call */

/* The windows end in this order (the configuration check makes it so):
 * 0 all open; 1 the client's retry window ended; 2 the redelivery window
 * ended (the chain client retry + redelivery); 3 the horizon passed (an
 * older dead letter is refused); 4 the retention passed (the cleanup may
 * remove the record). */
byte clock = 0;

inline tell() {
	if
	:: answered == 0 -> answered = stored
	:: else -> assert(answered == stored)   /* every answer is the first definitive one */
	fi
}

/* An attempt from src arrives: or does not, once its window has ended. */
inline arrive(src) {
	if
	:: src == CLIENT && clock >= 1 -> goto gone
	:: src == BROKER && clock >= 2 -> goto gone
	:: src == DLQ && clock >= 3 -> goto gone
	:: else -> skip
	fi;
	assert(src == SWEEPER || !removed)   /* no replay source reaches a removed record */
}

/* One attempt of the intent, from src, through the three phases. */
inline attempt(src, mine, key, lookup, resumed, got) {
	mine = 0; key = 0; lookup = false; resumed = false; got = 0;
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
	atomic { rec = PROC; token++; mine = token; expired = false; effects++; calling++ };  /* ... inserted */
	goto open;
claimed:
#endif
	atomic {
		arrive(src);
		if
		:: src != SWEEPER && rec == NONE ->                            /* first */
			rec = PROC; token++; mine = token; expired = false; effects++; calling++
		:: src != SWEEPER && rec == DONE -> tell(); goto gone          /* replay */
		:: rec == RETRY || (rec == PROC && expired) ->                 /* resume */
			resumed = true; lookup = (rec == PROC);   /* its owner died: ask first */
			rec = PROC; token++; mine = token; expired = false; calling++
		:: else -> goto gone      /* 409 in flight; nothing for the sweeper */
		fi
	}
open:
	assert(effects <= 1);         /* one transition, one pending payment */
	if
	:: atomic { faults < FAULTS -> faults++; calling--;   /* crash: the lease runs out */
		if :: rec == PROC && token == mine -> expired = true :: else -> skip fi };
		goto gone
	:: skip
	fi;

	/* Phase 2: ask the channel under the intent's stable key. */
#ifdef NEW_KEY
	key = mine;
#endif
	atomic {
		/* A resumed intent older than the channel's key window asks first
		 * too. The age is read at the claim and the call follows within
		 * the channel timeout, which the code adds to the age: one step. */
#ifndef NO_LOOKUP
		lookup = lookup || (resumed && aged);
#else
		lookup = false;
#endif
		if
		:: lookup && ledger[key] != 0 -> skip     /* the lookup finds the answer */
		:: lookup && ledger[key] == 0 || !lookup ->
			if
			:: ledger[key] != 0 && !forgot -> skip /* the channel replays its answer */
			:: ledger[key] == 0 || forgot -> ledger[key] = CHARGED; charges++
			:: ledger[key] == 0 || forgot -> ledger[key] = DECLINED
			fi
		fi;
		got = ledger[key];
		calling--;
		assert(charges <= 1)                        /* never two charges */
	}
	if
	:: atomic { faults < FAULTS -> faults++;     /* crash after the call */
		if :: rec == PROC && token == mine -> expired = true :: else -> skip fi };
		goto gone
	:: atomic { faults < FAULTS -> faults++;     /* the answer is lost: resumable */
		if :: rec == PROC && token == mine -> rec = RETRY :: else -> skip fi };
		goto gone
	:: skip
	fi;

	/* Phase 3: store the answer, fenced by the lease token. */
	atomic {
		if
#ifdef NO_FENCING
		:: rec == PROC ->
#else
		:: rec == PROC && token == mine ->
#endif
			assert(token == mine);   /* a superseded owner never writes */
			rec = DONE; stored = got;
			if :: src != SWEEPER -> tell() :: else -> skip fi
		:: else -> skip          /* fenced: its successor answers */
		fi
	}
gone:
	skip
}

proctype request(byte src) {
	byte mine, key, got; bool lookup, resumed;
	attempt(src, mine, key, lookup, resumed, got)
}

/* The sweeper: takes over expired leases and retryable intents, for as
 * long as the service runs. */
active proctype sweeper() {
	byte mine, key, got; bool lookup, resumed;
end:
	do
#ifndef NO_SWEEPER
	:: rec == RETRY || (rec == PROC && expired) -> attempt(SWEEPER, mine, key, lookup, resumed, got)
#else
	:: false -> attempt(SWEEPER, mine, key, lookup, resumed, got)
#endif
	od
}

/* An owner too slow for its lease loses its right (a fault). */
active proctype leases() {
end:
	do
	:: atomic { rec == PROC && !expired && faults < FAULTS -> faults++; expired = true }
	od
}

/* Time: the windows end one after another. The record grows older than
 * the channel's key window at some point after it was written, and only
 * then may the channel forget the key (its first use came after), never
 * while an owner is between its claim and its call: that takes a channel
 * timeout, a key window is a day. */
active proctype time() {
	do
	:: clock < 4 -> clock++
	:: rec != NONE && !aged -> aged = true
	:: aged && !forgot && calling == 0 -> forgot = true
	:: clock == 4 -> break
	od
}

/* The cleanup removes a finished record once its retention has passed. */
active proctype cleanup() {
end:
	atomic {
#ifdef SHORT_RETENTION
		clock >= 1 &&          /* kept for the client's window only */
#else
		clock >= 4 &&
#endif
		rec == DONE -> removed = true; rec = NONE
	}
}

init {
	atomic {
		run request(CLIENT);   /* the first request */
		run request(CLIENT);   /* its retry, on another instance */
		run request(BROKER);   /* the same intent as a command, redelivered */
		run request(DLQ)       /* its dead letter, replayed by an operator */
	}
}

/* Liveness, under weak fairness: an intent begun ends definitive. */
ltl ends_definitive { [] ((rec == PROC || rec == RETRY) -> <> (rec == DONE)) }
