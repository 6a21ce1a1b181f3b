//! A linearizability checker for one stream: given a history of concurrent operations
//! (each with the instant it was called, the instant it returned and what it returned),
//! it searches for one order of all of them that respects real time (an operation that
//! returned before another was called comes first) and in which every operation, applied
//! one at a time to the model of a single stream, returns what it really returned.
//!
//! The search is Wing & Gong's, with Lowe's memoization as Porcupine uses it: walk the
//! history's call and return events in time order; at a call, try to linearize that
//! operation now (the model accepts its outcome) and restart from the first event; at a
//! return of an operation not yet linearized, this path is dead, so undo the last choice
//! and try the next call instead. A (set of linearized operations, model state) pair that
//! was already explored is not explored again. Operations that change nothing (reads,
//! check-tails, refused conditions) are tried before the rest at every point, and one that
//! fits is the only choice made there (see `Pass`).
//!
//! An operation whose outcome is unknown (the client timed out, the connection broke, the
//! server was killed) has no return event: it may take effect at any moment after its
//! call, or never. Unknown reads and check-tails carry no information and are dropped.
//! Left free, a few dozen unknown appends would make the search exponential (any subset,
//! in any order, before any known operation), so before searching the history is read
//! for where they can be (see `Placement`): a record that only one append holds and that
//! some read returned fixes that append's position; positions that acknowledged appends
//! or such reads account for are closed to every other append; and an unknown append of
//! ordinary records that no read saw never needs to take effect past every tail anyone
//! observed, since nothing after it could tell (it is as if it never happened). Such an
//! append's records are never read, so where it fills a gap only its length matters: the
//! model keeps them as unseen filler, and orders of fillers that end alike are explored
//! once. Such appends that are alike in every way the model sees (length, conditions, no
//! pipeline) are interchangeable: any order that uses some of them can use the earliest
//! called ones instead, in call order, so only that choice is tried. An unknown append
//! that can no longer take effect on the path being explored (its position is passed, or
//! a later operation of its pipeline was placed) is taken out of the event list until
//! the path is taken back, rather than stepped over at every restart. Operations of one
//! pipeline take effect in the order they were sent.
//!
//! The model of a stream: a sequence of records (ordinary ones, and `fence` and `trim`
//! command records, which take a position like any record), its fencing token and its
//! trim point. Appends may require a sequence number (`match_seq_num`) or a fencing token;
//! a refused condition is answered with the tail or the token as they were. A read from a
//! position returns exactly the records from there (or from the trim point, if that is
//! later) up to its limit or the tail; a read with nothing to return (it starts at or past
//! the tail) is refused with the tail.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// A record as far as the model cares.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// An ordinary record, named by its body (unique within a test).
    Data(String),
    /// A `fence` command record setting this token (empty clears it).
    Fence(String),
    /// A `trim` command record asking for this earliest sequence number.
    Trim(u64),
}

/// What a client asked for.
#[derive(Clone, Debug)]
pub enum Call {
    /// Append `records` as one batch, if the conditions given hold.
    Append {
        records: Vec<Record>,
        match_seq_num: Option<u64>,
        fencing_token: Option<String>,
    },
    /// Read up to `limit` records from sequence number `from`.
    Read {
        from: u64,
        limit: usize,
    },
    CheckTail,
}

/// What the client got back.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The batch was appended at `start..start + len`.
    Appended { start: u64 },
    /// 412: `match_seq_num` was not the tail, which was `tail`.
    SeqNumMismatch { tail: u64 },
    /// 412: the fencing token given was not the stream's, which was `token`.
    FencingTokenMismatch { token: String },
    /// The records read, with their sequence numbers.
    Records(Vec<(u64, Record)>),
    /// 416: the read started past the tail, which was `tail`.
    PastTail { tail: u64 },
    /// The tail a check-tail returned.
    Tail(u64),
    /// No answer: it may have taken effect, or not, at any moment after the call.
    Unknown,
}

/// One operation of a history.
#[derive(Clone, Debug)]
pub struct Operation {
    /// Who called it (for reports only).
    pub client: String,
    /// The pipelined session or connection it was sent on, if any: the server applies
    /// one pipeline's operations in the order they were sent (an S2S append session, a
    /// RESP connection), so they take effect in that order, whatever their outcomes.
    pub pipeline: Option<String>,
    pub call: Call,
    pub outcome: Outcome,
    pub called: Instant,
    /// When the answer arrived (ignored for `Outcome::Unknown`).
    pub returned: Instant,
}

impl Operation {
    fn is_unknown(&self) -> bool {
        matches!(self.outcome, Outcome::Unknown)
    }
}

/// A history that no order explains, and how far the search got.
#[derive(Debug)]
pub struct Violation {
    /// The most operations the search could ever put in order.
    pub longest_prefix: usize,
    /// The operation that could not be placed at that point (its answer had arrived).
    pub stuck_at: Operation,
    /// The model's state at that point.
    pub tail: u64,
    pub fencing_token: String,
    pub trim_point: u64,
    /// The operations of that longest order, last ones last (up to 10).
    pub last_placed: Vec<Operation>,
    /// The instant the history's times are shown relative to.
    origin: Instant,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1000.0;
        let show = |op: &Operation| {
            format!(
                "{} [{:.3} ms .. {:.3} ms] {:?} -> {:?}",
                op.client,
                at(op.called),
                at(op.returned),
                op.call,
                op.outcome
            )
        };
        writeln!(
            f,
            "not linearizable: at most {} operations could be put in order; then this one \
             could not, the stream being at tail {} (fencing token {:?}, trim point {}):",
            self.longest_prefix, self.tail, self.fencing_token, self.trim_point
        )?;
        writeln!(f, "  {}", show(&self.stuck_at))?;
        writeln!(f, "the last operations of that order:")?;
        for op in &self.last_placed {
            writeln!(f, "  {}", show(op))?;
        }
        Ok(())
    }
}

/// Why a check did not succeed.
#[derive(Debug)]
pub enum CheckError {
    NotLinearizable(Box<Violation>),
    /// The search took more steps than allowed: neither proved nor refuted.
    GaveUp {
        steps: u64,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::NotLinearizable(violation) => violation.fmt(f),
            CheckError::GaveUp { steps } => write!(
                f,
                "the search gave up after {steps} steps without deciding: the history \
                 is too concurrent to check"
            ),
        }
    }
}

/// What a successful check looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Operations with a known outcome, all placed.
    pub known: usize,
    /// Appends with an unknown outcome.
    pub unknown_appends: usize,
    /// Of those, the ones the linearization found took effect.
    pub unknown_applied: usize,
    pub steps: u64,
}

/// The search's step budget: far more than a history of tens of thousands of operations
/// from a correct server needs, few enough to end in seconds.
const MAX_STEPS: u64 = 50_000_000;

/// Checks that `history` is linearizable with respect to one stream that starts empty.
pub fn check(history: &[Operation]) -> Result<Checked, CheckError> {
    check_with_budget(history, MAX_STEPS)
}

fn check_with_budget(history: &[Operation], max_steps: u64) -> Result<Checked, CheckError> {
    // Unknown reads and check-tails changed nothing and tell nothing.
    let ops: Vec<&Operation> = history
        .iter()
        .filter(|op| !op.is_unknown() || matches!(op.call, Call::Append { .. }))
        .collect();
    for op in &ops {
        assert!(
            op.is_unknown() || op.returned >= op.called,
            "{op:?} returned before it was called"
        );
        assert!(
            outcome_fits_call(op),
            "{op:?}: an outcome that call cannot have"
        );
    }
    let placements = Placements::of(&ops);
    let mut pipelines = Pipelines::of(&ops);
    let mut events = Events::of(&ops);
    let known = ops.iter().filter(|op| !op.is_unknown()).count();
    let mut remaining_known = known;
    let mut stream = Model::default();
    let mut placed = BitSet::new(ops.len());
    let mut explored: HashSet<(BitSet, StateKey)> = HashSet::new();
    let mut choices: Vec<Choice> = Vec::new();
    // Call events of unknown appends that can no longer take effect, lifted from the
    // list, each with the number of choices made when it was.
    let mut dropped: Vec<(usize, usize)> = Vec::new();
    let mut deepest: Option<(usize, Violation)> = None;
    let mut steps = 0u64;
    let mut pass = Pass::Observers;
    let mut event = events.first(false);
    loop {
        if remaining_known == 0 {
            // What is left are unknown appends: each may simply never have happened.
            let unknown_applied = choices.iter().filter(|c| ops[c.op].is_unknown()).count();
            return Ok(Checked {
                known,
                unknown_appends: ops.len() - known,
                unknown_applied,
                steps,
            });
        }
        steps += 1;
        if steps > max_steps {
            return Err(CheckError::GaveUp { steps });
        }
        match event.map(|e| events.kind[e]) {
            Some(EventKind::Call(op)) => {
                let e = event.unwrap();
                if ops[op].is_unknown()
                    && (!pipelines.allows(op) || placements.never_from(op, stream.tail()))
                {
                    // The tail only grows and a pipeline only advances on this path.
                    events.lift(e);
                    dropped.push((choices.len(), e));
                    event = events.next(e);
                    continue;
                }
                if observes(ops[op]) != (pass == Pass::Observers) {
                    // Tried in the other pass at this point.
                    event = events.next(e);
                    continue;
                }
                let allowed = pipelines.allows(op) && placements.allows(op, stream.tail(), &placed);
                let applied = allowed
                    .then(|| stream.apply(ops[op], placements.is_filler(op)))
                    .flatten();
                let Some(undo) = applied else {
                    event = events.next(e);
                    continue;
                };
                placed.set(op);
                if explored.insert((placed.clone(), stream.key())) {
                    let pipeline_before = pipelines.place(op);
                    events.lift(e);
                    if !ops[op].is_unknown() {
                        remaining_known -= 1;
                    }
                    choices.push(Choice {
                        op,
                        event: e,
                        undo,
                        pipeline_before,
                    });
                    pass = Pass::Observers;
                    event = events.first(false);
                    continue;
                }
                placed.clear(op);
                stream.undo(undo);
                if pass == Pass::Others {
                    event = events.next(e);
                    continue;
                }
                // An observer fits here, and the orders from here with it first were
                // explored and failed: so does every order from here.
            }
            Some(EventKind::Return(_)) if pass == Pass::Observers => {
                pass = Pass::Others;
                event = events.first(placements.unknown_may_fit(stream.tail()));
                continue;
            }
            Some(EventKind::Return(op)) => {
                // `op` answered before being placed: remember the deepest such dead end
                // for the report.
                if deepest
                    .as_ref()
                    .is_none_or(|(depth, _)| choices.len() > *depth)
                {
                    let origin = ops.iter().map(|o| o.called).min().unwrap();
                    let last_placed = choices[choices.len().saturating_sub(10)..]
                        .iter()
                        .map(|c| ops[c.op].clone())
                        .collect();
                    deepest = Some((
                        choices.len(),
                        Violation {
                            longest_prefix: choices.len(),
                            stuck_at: ops[op].clone(),
                            tail: stream.tail(),
                            fencing_token: stream.fencing_token.clone(),
                            trim_point: stream.trim_point,
                            last_placed,
                            origin,
                        },
                    ));
                }
            }
            None => unreachable!("a known operation's return event ends the list"),
        }
        // A dead end: take back the last choice and try the next operation after it.
        loop {
            let Some(choice) = choices.pop() else {
                let (_, violation) = deepest.expect("a dead end was met");
                return Err(CheckError::NotLinearizable(Box::new(violation)));
            };
            // What was dropped after this choice comes back first (the list is
            // restored in the reverse order of its changes).
            while let Some(&(depth, e)) = dropped.last() {
                if depth <= choices.len() {
                    break;
                }
                dropped.pop();
                events.unlift(e);
            }
            stream.undo(choice.undo);
            pipelines.unplace(choice.op, choice.pipeline_before);
            placed.clear(choice.op);
            events.unlift(choice.event);
            if !ops[choice.op].is_unknown() {
                remaining_known += 1;
            }
            // An observer was the only operation tried where it was placed.
            if !observes(ops[choice.op]) {
                pass = Pass::Others;
                event = events.next(choice.event);
                break;
            }
        }
    }
}

/// Which operations a walk of the event list tries, at each point of the search.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Observers called before the first return still in the list (see `observes`): one
    /// that fits is placed, and nothing else is tried there. Any order from that point
    /// could have placed it first, since it changes nothing and everything that must
    /// come before it is placed; so if one fails, they all do. Trying appends first
    /// instead would find a read of the tail as it was only after taking them back.
    Observers,
    /// Every other operation: unknown appends first, where one may fit, then the rest.
    Others,
}

/// Whether `op` changes nothing (a read, a check-tail, a refused condition) and no
/// pipeline orders it.
fn observes(op: &Operation) -> bool {
    op.pipeline.is_none() && !matches!(op.outcome, Outcome::Appended { .. } | Outcome::Unknown)
}

/// Where an unknown append may take effect, as the history constrains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// A read returned one of its records, which no other append holds: only here.
    At(u64),
    /// Only on positions nothing else accounts for, below the highest tail observed.
    InGaps,
    /// It holds command records, which change what later operations see even where no
    /// read reaches: on any position nothing else accounts for.
    Unclaimed,
}

/// An unknown append as the search sees it.
#[derive(Clone, Copy)]
struct Shape {
    placement: Placement,
    /// Its number of records.
    len: u64,
    match_seq_num: Option<u64>,
    /// The operation called just before it among those it is interchangeable with.
    earlier_twin: Option<usize>,
}

/// What the history says about positions, computed once before the search.
struct Placements {
    /// Each operation's shape; `None` for one with a known outcome, or not an append.
    of_op: Vec<Option<Shape>>,
    /// Positions whose record is known: acknowledged, or read and held by one append.
    claimed: HashSet<u64>,
    /// The highest tail any operation observed.
    horizon: u64,
    /// Where unknown appends placed `At` start.
    seen_starts: HashSet<u64>,
}

impl Placements {
    fn of(ops: &[&Operation]) -> Placements {
        let batch = |op: &Operation| match &op.call {
            Call::Append { records, .. } => Some(records.clone()),
            _ => None,
        };
        // Records held by exactly one append, once, identify it.
        let mut holders: HashMap<&Record, usize> = Default::default();
        for op in ops {
            if let Call::Append { records, .. } = &op.call {
                for record in records {
                    *holders.entry(record).or_default() += 1;
                }
            }
        }
        let identifying = |record: &Record| holders.get(record) == Some(&1);
        let mut seen_at: HashMap<&Record, u64> = Default::default();
        let mut claimed = HashSet::new();
        let mut horizon = 0;
        for op in ops {
            match (&op.call, &op.outcome) {
                (Call::Append { records, .. }, Outcome::Appended { start }) => {
                    let end = start + records.len() as u64;
                    claimed.extend(*start..end);
                    horizon = horizon.max(end);
                }
                (_, Outcome::Records(read)) => {
                    for (seq, record) in read {
                        horizon = horizon.max(seq + 1);
                        if identifying(record) {
                            claimed.insert(*seq);
                            seen_at.entry(record).or_insert(*seq);
                        }
                    }
                }
                (
                    _,
                    Outcome::Tail(tail)
                    | Outcome::PastTail { tail }
                    | Outcome::SeqNumMismatch { tail },
                ) => horizon = horizon.max(*tail),
                _ => {}
            }
        }
        let mut of_op: Vec<Option<Shape>> = ops
            .iter()
            .map(|op| {
                let records = batch(op).filter(|_| op.is_unknown())?;
                let seen = records.iter().enumerate().find_map(|(i, record)| {
                    seen_at
                        .get(record)
                        .filter(|_| identifying(record))
                        .map(|seq| seq.checked_sub(i as u64))
                });
                let placement = match seen {
                    // Seen at a position its batch cannot start before: nowhere.
                    Some(start) => Placement::At(start.unwrap_or(u64::MAX)),
                    // Ordinary records that no read returned and that no other append
                    // holds: no read can have returned them.
                    None if records
                        .iter()
                        .all(|r| matches!(r, Record::Data(_)) && identifying(r)) =>
                    {
                        Placement::InGaps
                    }
                    None => Placement::Unclaimed,
                };
                let Call::Append { match_seq_num, .. } = op.call else {
                    unreachable!("only appends have a batch")
                };
                Some(Shape {
                    placement,
                    len: records.len() as u64,
                    match_seq_num,
                    earlier_twin: None,
                })
            })
            .collect();
        // Fillers off any pipeline with the same length and conditions leave the same
        // stream wherever they take effect: twins, used in call order.
        let mut by_call: Vec<usize> = (0..ops.len()).collect();
        by_call.sort_by_key(|i| ops[*i].called);
        let mut last_of_kind: HashMap<(u64, Option<u64>, Option<&str>), usize> = HashMap::new();
        for i in by_call {
            let (Some(shape), None, Call::Append { fencing_token, .. }) =
                (&mut of_op[i], &ops[i].pipeline, &ops[i].call)
            else {
                continue;
            };
            if shape.placement == Placement::InGaps {
                let kind = (shape.len, shape.match_seq_num, fencing_token.as_deref());
                shape.earlier_twin = last_of_kind.insert(kind, i);
            }
        }
        let seen_starts = of_op
            .iter()
            .flatten()
            .filter_map(|shape| match shape.placement {
                Placement::At(start) => Some(start),
                _ => None,
            })
            .collect();
        Placements {
            of_op,
            claimed,
            horizon,
            seen_starts,
        }
    }

    /// Whether `op`'s records, where it takes effect, are never read by anyone.
    fn is_filler(&self, op: usize) -> bool {
        self.of_op[op].is_some_and(|shape| shape.placement == Placement::InGaps)
    }

    /// Whether operation `op` may take effect on a stream whose tail is `tail`, with the
    /// operations in `placed` having taken effect before.
    fn allows(&self, op: usize, tail: u64, placed: &BitSet) -> bool {
        let Some(shape) = self.of_op[op] else {
            return true;
        };
        let unclaimed = || (tail..tail + shape.len).all(|seq| !self.claimed.contains(&seq));
        match shape.placement {
            Placement::At(start) => start == tail,
            Placement::InGaps => {
                tail + shape.len <= self.horizon
                    && unclaimed()
                    && shape.earlier_twin.is_none_or(|twin| placed.contains(twin))
            }
            Placement::Unclaimed => unclaimed(),
        }
    }

    /// Whether any unknown append may take effect on a stream whose tail is `tail`: one
    /// seen to start there, or any on a position nothing accounts for.
    fn unknown_may_fit(&self, tail: u64) -> bool {
        !self.claimed.contains(&tail) || self.seen_starts.contains(&tail)
    }

    /// Whether unknown append `op` cannot take effect on a stream whose tail is `tail`
    /// nor on any longer one.
    fn never_from(&self, op: usize, tail: u64) -> bool {
        let Some(shape) = self.of_op[op] else {
            return false;
        };
        let passed = match shape.placement {
            Placement::At(start) => start < tail,
            Placement::InGaps => tail + shape.len > self.horizon,
            Placement::Unclaimed => false,
        };
        passed || shape.match_seq_num.is_some_and(|seq| seq < tail)
    }
}

fn outcome_fits_call(op: &Operation) -> bool {
    matches!(
        (&op.call, &op.outcome),
        (
            Call::Append { .. },
            Outcome::Appended { .. } | Outcome::Unknown
        ) | (
            Call::Append {
                match_seq_num: Some(_),
                ..
            },
            Outcome::SeqNumMismatch { .. }
        ) | (
            Call::Append {
                fencing_token: Some(_),
                ..
            },
            Outcome::FencingTokenMismatch { .. }
        ) | (
            Call::Read { .. },
            Outcome::Records(_) | Outcome::PastTail { .. }
        ) | (Call::CheckTail, Outcome::Tail(_))
    )
}

/// An operation placed in the order being built, and how to take it back.
struct Choice {
    op: usize,
    event: usize,
    undo: Undo,
    pipeline_before: Option<usize>,
}

/// The order within each pipeline: an operation never takes effect after one sent later
/// on the same pipeline. Placing one rules out the earlier ones not placed yet (unknown
/// appends that did not take effect; a known one makes this path a dead end).
struct Pipelines {
    /// Each operation's pipeline and its place in it (in call order).
    of_op: Vec<Option<(usize, usize)>>,
    /// For each pipeline, the place of the last operation placed.
    last_placed: Vec<Option<usize>>,
}

impl Pipelines {
    fn of(ops: &[&Operation]) -> Pipelines {
        let mut ids: HashMap<&str, usize> = HashMap::new();
        let mut by_call: Vec<usize> = (0..ops.len()).collect();
        by_call.sort_by_key(|i| ops[*i].called);
        let mut of_op = vec![None; ops.len()];
        let mut lengths: Vec<usize> = Vec::new();
        for i in by_call {
            if let Some(name) = &ops[i].pipeline {
                let next_id = ids.len();
                let id = *ids.entry(name).or_insert(next_id);
                if id == lengths.len() {
                    lengths.push(0);
                }
                of_op[i] = Some((id, lengths[id]));
                lengths[id] += 1;
            }
        }
        Pipelines {
            of_op,
            last_placed: vec![None; lengths.len()],
        }
    }

    fn allows(&self, op: usize) -> bool {
        self.of_op[op].is_none_or(|(id, at)| self.last_placed[id].is_none_or(|last| at > last))
    }

    /// Records `op` as placed; returns what `unplace` needs to take that back.
    fn place(&mut self, op: usize) -> Option<usize> {
        let (id, at) = self.of_op[op]?;
        self.last_placed[id].replace(at)
    }

    fn unplace(&mut self, op: usize, before: Option<usize>) {
        if let Some((id, _)) = self.of_op[op] {
            self.last_placed[id] = before;
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum EventKind {
    Call(usize),
    Return(usize),
}

/// The history's events in time order, as two doubly linked lists from which placed
/// operations are lifted (and put back, in reverse order, on backtracking): the calls and
/// returns of operations with a known outcome, and the calls of unknown appends. The
/// search walks the unknown ones only where one of them may take effect, and only those
/// called before the first return still in the known list; then the known list.
struct Events {
    kind: Vec<EventKind>,
    /// For each operation, its return event (none for an unknown outcome).
    return_of: Vec<Option<usize>>,
    /// Links; indices `known_head()` and `unknown_head()` are the lists' heads.
    next: Vec<Option<usize>>,
    prev: Vec<usize>,
}

impl Events {
    fn of(ops: &[&Operation]) -> Events {
        let mut timed: Vec<(Instant, u8, EventKind)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            // At equal instants calls come first: the operations count as overlapping.
            timed.push((op.called, 0, EventKind::Call(i)));
            if !op.is_unknown() {
                timed.push((op.returned, 1, EventKind::Return(i)));
            }
        }
        timed.sort_by_key(|(at, order, _)| (*at, *order));
        let kind: Vec<EventKind> = timed.into_iter().map(|(_, _, k)| k).collect();
        let n = kind.len();
        let mut return_of = vec![None; ops.len()];
        for (e, k) in kind.iter().enumerate() {
            if let EventKind::Return(op) = k {
                return_of[*op] = Some(e);
            }
        }
        let mut events = Events {
            kind,
            return_of,
            next: vec![None; n + 2],
            prev: vec![n; n + 2],
        };
        let (mut last_known, mut last_unknown) = (events.known_head(), events.unknown_head());
        for e in 0..n {
            let last = if events.is_unknown_call(e) {
                &mut last_unknown
            } else {
                &mut last_known
            };
            events.next[*last] = Some(e);
            events.prev[e] = *last;
            *last = e;
        }
        events
    }

    fn known_head(&self) -> usize {
        self.kind.len()
    }

    fn unknown_head(&self) -> usize {
        self.kind.len() + 1
    }

    fn is_unknown_call(&self, e: usize) -> bool {
        matches!(self.kind[e], EventKind::Call(op) if self.return_of[op].is_none())
    }

    /// Where a walk starts: the unknown calls first when `unknown_may_fit`.
    fn first(&self, unknown_may_fit: bool) -> Option<usize> {
        if unknown_may_fit {
            self.unknown_or_known(self.next[self.unknown_head()])
        } else {
            self.next[self.known_head()]
        }
    }

    fn next(&self, e: usize) -> Option<usize> {
        if self.is_unknown_call(e) {
            self.unknown_or_known(self.next[e])
        } else {
            self.next[e]
        }
    }

    /// `unknown` if it was called before the first return in the known list (an
    /// operation cannot take effect after one that had already returned without taking
    /// effect before it), otherwise the start of the known list.
    fn unknown_or_known(&self, unknown: Option<usize>) -> Option<usize> {
        let first_known = self.next[self.known_head()];
        let Some(unknown) = unknown else {
            return first_known;
        };
        let mut e = first_known;
        while let Some(known) = e {
            if known > unknown {
                return Some(unknown);
            }
            if matches!(self.kind[known], EventKind::Return(_)) {
                return first_known;
            }
            e = self.next[known];
        }
        Some(unknown)
    }

    fn unlink(&mut self, e: usize) {
        let (prev, next) = (self.prev[e], self.next[e]);
        self.next[prev] = next;
        if let Some(next) = next {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, e: usize) {
        let (prev, next) = (self.prev[e], self.next[e]);
        self.next[prev] = Some(e);
        if let Some(next) = next {
            self.prev[next] = e;
        }
    }

    /// Takes the call event `e` and its operation's return event, if any, out of the list.
    fn lift(&mut self, e: usize) {
        self.unlink(e);
        if let EventKind::Call(op) = self.kind[e] {
            if let Some(returned) = self.return_of[op] {
                self.unlink(returned);
            }
        }
    }

    /// Undoes the last `lift`.
    fn unlift(&mut self, e: usize) {
        if let EventKind::Call(op) = self.kind[e] {
            if let Some(returned) = self.return_of[op] {
                self.relink(returned);
            }
        }
        self.relink(e);
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct BitSet(Vec<u64>);

impl BitSet {
    fn new(len: usize) -> BitSet {
        BitSet(vec![0; len.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

/// The model's state as the memo sees it: the records by a hash of them all.
#[derive(Clone, PartialEq, Eq, Hash)]
struct StateKey {
    tail: u64,
    records_hash: u64,
    fencing_token: String,
    trim_point: u64,
}

/// A position of the model's stream.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Slot {
    Holds(Record),
    /// A record that no operation ever observes (see `Placement::InGaps`): any read of
    /// it is a mismatch, and which append put it there makes no difference.
    Filler,
}

/// The model of one stream.
#[derive(Default)]
struct Model {
    records: Vec<Slot>,
    /// `prefix_hashes[i]` is a hash of `records[..=i]`.
    prefix_hashes: Vec<u64>,
    fencing_token: String,
    trim_point: u64,
}

/// How to take one applied operation back.
enum Undo {
    Nothing,
    Appended {
        tail: u64,
        fencing_token: String,
        trim_point: u64,
    },
}

impl Model {
    fn tail(&self) -> u64 {
        self.records.len() as u64
    }

    fn key(&self) -> StateKey {
        StateKey {
            tail: self.tail(),
            records_hash: self.prefix_hashes.last().copied().unwrap_or(0),
            fencing_token: self.fencing_token.clone(),
            trim_point: self.trim_point,
        }
    }

    /// Applies `op` if the stream, as it is now, would have answered it as it was
    /// answered; `None` if not.
    fn apply(&mut self, op: &Operation, filler: bool) -> Option<Undo> {
        let tail = self.tail();
        match (&op.call, &op.outcome) {
            (
                Call::Append {
                    records,
                    match_seq_num,
                    fencing_token,
                },
                outcome,
            ) => {
                let seq_ok = match_seq_num.is_none_or(|m| m == tail);
                let token_ok = fencing_token
                    .as_ref()
                    .is_none_or(|t| *t == self.fencing_token);
                match outcome {
                    Outcome::Appended { start } if *start == tail && seq_ok && token_ok => {
                        Some(self.append(records, filler))
                    }
                    Outcome::Unknown if seq_ok && token_ok => Some(self.append(records, filler)),
                    Outcome::SeqNumMismatch { tail: answered } if !seq_ok => {
                        (*answered == tail).then_some(Undo::Nothing)
                    }
                    Outcome::FencingTokenMismatch { token } if !token_ok => {
                        (*token == self.fencing_token).then_some(Undo::Nothing)
                    }
                    _ => None,
                }
            }
            // A read that would start at or past the tail (after skipping what is
            // trimmed) is refused; so is one from past the tail.
            (Call::Read { from, .. }, Outcome::PastTail { tail: answered }) => {
                ((*from).max(self.trim_point) >= tail && *answered == tail).then_some(Undo::Nothing)
            }
            (Call::Read { from, limit }, Outcome::Records(read)) => {
                let first = (*from).max(self.trim_point);
                if first >= tail {
                    return None;
                }
                let first = first as usize;
                let end = (first + limit).min(self.records.len());
                let expected = &self.records[first..end];
                let matches =
                    read.len() == expected.len()
                        && read.iter().zip(expected).enumerate().all(
                            |(i, ((seq, record), want))| {
                                *seq == (first + i) as u64 && *want == Slot::Holds(record.clone())
                            },
                        );
                matches.then_some(Undo::Nothing)
            }
            (Call::CheckTail, Outcome::Tail(answered)) => {
                (*answered == tail).then_some(Undo::Nothing)
            }
            _ => None,
        }
    }

    fn append(&mut self, records: &[Record], filler: bool) -> Undo {
        let undo = Undo::Appended {
            tail: self.tail(),
            fencing_token: self.fencing_token.clone(),
            trim_point: self.trim_point,
        };
        for record in records {
            let seq_num = self.tail();
            match record {
                Record::Fence(token) => self.fencing_token = token.clone(),
                // A trim point never goes back, and never past the trim record itself.
                Record::Trim(requested) => {
                    self.trim_point = self.trim_point.max((*requested).min(seq_num + 1))
                }
                Record::Data(_) => {}
            }
            let slot = if filler {
                Slot::Filler
            } else {
                Slot::Holds(record.clone())
            };
            let mut hasher = DefaultHasher::new();
            (self.prefix_hashes.last(), &slot).hash(&mut hasher);
            self.prefix_hashes.push(hasher.finish());
            self.records.push(slot);
        }
        undo
    }

    fn undo(&mut self, undo: Undo) {
        if let Undo::Appended {
            tail,
            fencing_token,
            trim_point,
        } = undo
        {
            self.records.truncate(tail as usize);
            self.prefix_hashes.truncate(tail as usize);
            self.fencing_token = fencing_token;
            self.trim_point = trim_point;
        }
    }
}

/// Builds histories by hand, with times in milliseconds from one origin: for the
/// checker's own tests.
pub struct HandHistory {
    origin: Instant,
    pub ops: Vec<Operation>,
}

impl Default for HandHistory {
    fn default() -> Self {
        HandHistory {
            origin: Instant::now(),
            ops: Vec::new(),
        }
    }
}

impl HandHistory {
    /// Adds an operation called at `called` ms that returned at `returned` ms.
    pub fn op(&mut self, called: u64, returned: u64, call: Call, outcome: Outcome) -> &mut Self {
        self.ops.push(Operation {
            client: format!("op{}", self.ops.len()),
            pipeline: None,
            call,
            outcome,
            called: self.origin + Duration::from_millis(called),
            returned: self.origin + Duration::from_millis(returned),
        });
        self
    }

    /// Puts the last operation added on pipeline `name`.
    pub fn on_pipeline(&mut self, name: &str) -> &mut Self {
        self.ops.last_mut().expect("an operation").pipeline = Some(name.to_owned());
        self
    }

    pub fn check(&self) -> Result<Checked, CheckError> {
        check(&self.ops)
    }

    /// Checks with a small step budget (to show the budget is honoured).
    pub fn check_with_budget(&self, max_steps: u64) -> Result<Checked, CheckError> {
        check_with_budget(&self.ops, max_steps)
    }
}

/// An append of data records with these bodies, without conditions.
pub fn append(bodies: &[&str]) -> Call {
    Call::Append {
        records: bodies.iter().map(|b| Record::Data(b.to_string())).collect(),
        match_seq_num: None,
        fencing_token: None,
    }
}

/// The records of a read, numbered from `first`.
pub fn records_from(first: u64, bodies: &[&str]) -> Outcome {
    Outcome::Records(
        bodies
            .iter()
            .enumerate()
            .map(|(i, b)| (first + i as u64, Record::Data(b.to_string())))
            .collect(),
    )
}
