//! The firewall's side of the name check (`linnet-gate`, `crate::gate`):
//! which connections are held, and what becomes of them once judged. All
//! of it is conntrack marks, so a judged connection never leaves the
//! kernel again.
//!
//! - A VM's policy chain (in `forward`, priority 0) accepts a new TCP
//!   connection to an address it learned for a checked name rule
//!   (`Reach::checked`) with its conntrack mark set to `PENDING`
//!   (`pending`).
//! - Every packet the VM sends on a pending connection, its SYN first,
//!   goes to the queue (`host::gate_queue`: an `NFQUEUE` rule in
//!   iptables' `security FORWARD`, priority 150), whose verdict gives the
//!   packet a mark: `PASS` (nothing shown yet: the SYN, the handshake's
//!   ACK), `ALLOWED` or `REFUSED`; or sends it through that rule once more
//!   (a packet queued before its connection's verdict passes now).
//! - This table's `gate` chain (forward, priority 200: `rules`) turns
//!   those into the connection's state: allowed, never queued again;
//!   refused, reset (the VM gets a TCP reset) now and at every later
//!   packet. A pending connection's packet that comes without a verdict
//!   (the queue's rule gone) is dropped: nothing passes unchecked.
//!
//! The marks use two bits (`MASK`) of the 32, which kube-proxy's
//! (0x4000, 0x8000) and Cilium's (0x0f00) leave alone.

use std::borrow::Cow;

use nftables::expr::{BinaryOperation, Expression};
use nftables::stmt::{Counter as StmtCounter, Mangle, Match, Operator, Reject, Statement};
use nftables::types::RejectCode;

use super::{ct, drop, eq, meta, string};
use crate::policy::Policy;
use nftables::expr::MetaKey;
use nftables::stmt::RejectType;

/// The bits of the packet and conntrack marks the gate uses.
pub const MASK: u32 = 0x3000;
/// Conntrack: held until its first bytes show a name. Packet: this one
/// may pass, the connection is still held.
pub const PENDING: u32 = 0x1000;
pub const PASS: u32 = PENDING;
/// Its name was allowed: never queued again.
pub const ALLOWED: u32 = 0x2000;
/// Refused: reset, now and at every later packet.
pub const REFUSED: u32 = 0x3000;

/// The counter of every connection the gate refused.
pub const REFUSED_COUNTER: &str = "gate-refused";
/// The chain of `rules`, and its priority in the forward hook: after the
/// queue's rule (150).
pub const CHAIN: &str = "gate";
pub const PRIORITY: i32 = 200;

/// Whether `policy` has connections held for their name.
pub fn holds(policy: &Policy) -> bool {
    policy.name_reaches().iter().any(|r| r.checked())
}

/// `ct mark set ct mark & ~MASK | PENDING`, for the rule that accepts a
/// checked reach's new connection (whatever an earlier connection on its
/// conntrack entry left there).
pub(super) fn pending() -> Statement<'static> {
    Statement::Mangle(Mangle {
        key: ct("mark"),
        value: Expression::BinaryOperation(Box::new(BinaryOperation::OR(vec![
            Expression::BinaryOperation(Box::new(BinaryOperation::AND(
                ct("mark"),
                Expression::Number(!MASK),
            ))),
            Expression::Number(PENDING),
        ]))),
    })
}

/// `tcp flags & (syn | ack) == syn`: a connection's first packet.
pub(super) fn syn_alone() -> Statement<'static> {
    eq(
        Expression::BinaryOperation(Box::new(BinaryOperation::AND(
            super::payload("tcp", "flags"),
            Expression::Number(0x12),
        ))),
        Expression::Number(0x02),
    )
}

/// `KEY & MASK == value`.
fn marked(key: Expression<'static>, value: u32) -> Statement<'static> {
    eq(
        Expression::BinaryOperation(Box::new(BinaryOperation::AND(
            key,
            Expression::Number(MASK),
        ))),
        Expression::Number(value),
    )
}

/// `ct mark set ct mark OP value`.
fn set_ct(
    op: fn(Expression<'static>, u32) -> BinaryOperation<'static>,
    value: u32,
) -> Statement<'static> {
    Statement::Mangle(Mangle {
        key: ct("mark"),
        value: Expression::BinaryOperation(Box::new(op(ct("mark"), value))),
    })
}

fn reset() -> Statement<'static> {
    Statement::Reject(Some(Reject::new(
        Some(RejectType::TCPReset),
        None::<RejectCode>,
    )))
}

fn original() -> Statement<'static> {
    Statement::Match(Match {
        left: ct("direction"),
        right: string("original"),
        op: Operator::EQ,
    })
}

/// The `gate` chain's rules, when some VM has a checked reach.
pub(super) fn rules() -> Vec<Vec<Statement<'static>>> {
    let or = |ct: Expression<'static>, v: u32| BinaryOperation::OR(vec![ct, Expression::Number(v)]);
    // PENDING ^ (PENDING ^ ALLOWED) == ALLOWED.
    let xor = |ct: Expression<'static>, v: u32| BinaryOperation::XOR(ct, Expression::Number(v));
    vec![
        // Refused now: the connection too, and the VM gets its reset.
        vec![
            marked(meta(MetaKey::Mark), REFUSED),
            set_ct(or, REFUSED),
            Statement::Counter(StmtCounter::Named(Cow::Borrowed(REFUSED_COUNTER))),
            reset(),
        ],
        // Refused before: whatever the VM sends on it still.
        vec![marked(ct("mark"), REFUSED), original(), reset()],
        vec![
            marked(meta(MetaKey::Mark), ALLOWED),
            marked(ct("mark"), PENDING),
            set_ct(xor, PENDING ^ ALLOWED),
        ],
        // Pending and not judged: the queue's rule is not there.
        vec![
            marked(ct("mark"), PENDING),
            original(),
            Statement::Match(Match {
                left: Expression::BinaryOperation(Box::new(BinaryOperation::AND(
                    meta(MetaKey::Mark),
                    Expression::Number(MASK),
                ))),
                right: Expression::Number(PASS),
                op: Operator::NEQ,
            }),
            drop(),
        ],
    ]
}
