//! Builds the netlink batch for a plan (create-only, or delete-and-recreate of our tables).

use crate::model::{self, TableSpec};
use capture::{Plan, Table};
use nftnl::nftnl_sys as sys;
use nftnl::set::{Set, SetKey};
use nftnl::{Batch, Chain, ChainType, FinalizedBatch, Hook, MsgType, Policy, ProtoFamily, Rule};
use std::ffi::CString;

/// A plan's batch, and how to say which object a refused message creates.
pub struct Built<'p> {
    pub batch: FinalizedBatch,
    /// Netlink messages in the batch (batch begin and end not counted).
    pub messages: usize,
    plan: &'p Plan,
    how: How,
}

/// What a batch does with our tables.
#[derive(Clone)]
enum How {
    /// Delete these tables of ours (they exist), then create every table of the plan.
    Replace(Vec<Table>),
    /// Make the plan's tables exist with exactly its rules, keeping named sets' elements.
    Ensure,
}

/// One note per batch message, made only when asked for: formatting costs more than building
/// the batch, and the hot path only needs the notes when the kernel refuses something.
trait Notes {
    fn note(&mut self, text: impl FnOnce() -> String);
}

/// Counts the messages (the hot path).
struct Count(usize);

impl Notes for Count {
    fn note(&mut self, _: impl FnOnce() -> String) {
        self.0 += 1;
    }
}

/// What each message creates, in batch order (for error messages).
struct Described(Vec<String>);

impl Notes for Described {
    fn note(&mut self, text: impl FnOnce() -> String) {
        self.0.push(text());
    }
}

impl Built<'_> {
    /// The object a refused sequence number belongs to (the batch is built again, with its
    /// descriptions: only on this rare path).
    pub fn describe(&self, seq: u32) -> String {
        let seqs = self.batch.sequence_numbers();
        // With ACKed batch begin/end (kernel >= 6.10) the first sequence number is BATCH_BEGIN.
        let offset = if seqs.len() == self.messages + 2 {
            seqs.start + 1
        } else {
            seqs.start
        };
        let mut described = Described(Vec::new());
        assemble(self.plan, &self.how, &mut described);
        seq.checked_sub(offset)
            .and_then(|i| described.0.get(i as usize))
            .cloned()
            .unwrap_or_else(|| "the nftables batch".into())
    }
}

/// Key type used only to create sets through nftnl with the right type/length; elements are
/// added with raw calls so that interval ends can be flagged.
macro_rules! key_kind {
    ($name:ident, $key:expr) => {
        struct $name;
        impl SetKey for $name {
            const TYPE: u32 = $key.id();
            const LEN: u32 = $key.key_len();
            fn data(&self) -> Box<[u8]> {
                Box::new([])
            }
        }
    };
}
key_kind!(PortKey, nft_ir::SetKey::InetService);
key_kind!(V4Key, nft_ir::SetKey::Ipv4Addr);
key_kind!(V6Key, nft_ir::SetKey::Ipv6Addr);

fn cstr(s: &str) -> CString {
    CString::new(s).expect("object names have no NUL")
}

fn hook(h: nft_ir::Hook) -> Hook {
    match h {
        nft_ir::Hook::Prerouting => Hook::PreRouting,
        nft_ir::Hook::Postrouting => Hook::PostRouting,
        // The lowering only makes the three hooks above and output.
        nft_ir::Hook::Output | nft_ir::Hook::Other => Hook::Out,
    }
}

fn chain_type(kind: nft_ir::ChainType) -> ChainType {
    match kind {
        nft_ir::ChainType::Nat => ChainType::Nat,
        nft_ir::ChainType::Route => ChainType::Route,
        nft_ir::ChainType::Filter => ChainType::Filter,
    }
}

/// The batch for `plan`: delete `existing` (ours) first, then create every table of the plan.
pub fn build<'p>(plan: &'p Plan, existing: &[Table]) -> Built<'p> {
    built(plan, How::Replace(existing.to_vec()))
}

/// The batch that makes `plan`'s tables exist with exactly its chains and rules while keeping
/// what else is in them (the elements of named sets): tables, sets and chains are added if
/// missing, every rule of the tables is removed, and the plan's rules are added. Used for the
/// ambient host table, whose set elements come and go with pods.
pub fn ensure(plan: &Plan) -> Built<'_> {
    built(plan, How::Ensure)
}

fn built(plan: &Plan, how: How) -> Built<'_> {
    let mut count = Count(0);
    let batch = assemble(plan, &how, &mut count);
    Built {
        batch,
        messages: count.0,
        plan,
        how,
    }
}

/// The messages of the batch (the plan's `nft_ir` values serialised), each noted in `notes`.
fn assemble(plan: &Plan, how: &How, notes: &mut impl Notes) -> FinalizedBatch {
    let specs = model::tables(plan);
    let mut batch = Batch::new();
    let flush_rules = match how {
        How::Replace(existing) => {
            for t in existing {
                let table = nftnl::Table::new(cstr(t.nft_name()), ProtoFamily::Inet);
                batch.add(&table, MsgType::Del);
                notes.note(|| format!("deleting table inet {}", t.nft_name()));
            }
            false
        }
        How::Ensure => true,
    };
    for spec in &specs {
        add_table(&mut batch, notes, spec, flush_rules);
    }
    batch.finalize()
}

fn add_table(
    batch: &mut Batch,
    descriptions: &mut impl Notes,
    spec: &TableSpec,
    flush_rules: bool,
) {
    let tname = spec.table.nft_name();
    let table = nftnl::Table::new(cstr(tname), ProtoFamily::Inet);
    batch.add(&table, MsgType::Add);
    descriptions.note(|| format!("table inet {tname}"));
    for (i, s) in spec.sets.iter().enumerate() {
        // Set ids only need to be unique in the batch; anonymous sets count from 0.
        batch.add(
            &NamedSetMsg::new(tname, s, 0x8000_0000 + i as u32),
            MsgType::Add,
        );
        descriptions.note(|| format!("set {} in table inet {tname}", s.name));
    }
    // Chains first (rules may jump forward), then rules in order.
    let chains: Vec<Chain> = spec
        .chains
        .iter()
        .map(|c| {
            let mut chain = Chain::new(cstr(c.chain.nft_name()), &table);
            if let Some(b) = c.base {
                chain.set_hook(hook(b.hook), b.priority);
                chain.set_type(chain_type(b.kind));
                chain.set_policy(Policy::Accept);
            }
            chain
        })
        .collect();
    for (c, chain) in spec.chains.iter().zip(&chains) {
        batch.add(chain, MsgType::Add);
        descriptions.note(|| format!("chain {} in table inet {tname}", c.chain.nft_name()));
    }
    if flush_rules {
        batch.add(&FlushTableRules(cstr(tname)), MsgType::Del);
        descriptions.note(|| format!("removing the rules of table inet {tname}"));
    }
    for (c, chain) in spec.chains.iter().zip(&chains) {
        for r in &c.rules {
            for s in &r.sets {
                add_set(batch, descriptions, &table, s, || r.text(tname));
            }
            let mut rule = Rule::new(chain);
            for e in &r.rule.exprs {
                rule.add_expr(&crate::expr::of_ir(e));
            }
            // Comments are at most 128 bytes; ours are short constants, never user input.
            if let Some(comment) = &r.rule.comment {
                let _ = rule.set_comment(cstr(comment));
            }
            batch.add(&rule, MsgType::Add);
            descriptions.note(|| {
                format!(
                    "rule `{}` in chain {} of table inet {tname}",
                    r.text(tname),
                    c.chain.nft_name()
                )
            });
        }
    }
}

/// An anonymous set of a rule (`__setN`: created as `__set%d` with id N), of its key type.
fn add_set(
    batch: &mut Batch,
    descriptions: &mut impl Notes,
    table: &nftnl::Table,
    s: &nft_ir::Set,
    rule_text: impl Fn() -> String,
) {
    let name = c"__set%d";
    let id = s
        .anonymous_id()
        .expect("the lowering names its sets __setN");
    match s.key {
        nft_ir::SetKey::InetService => {
            let set = Set::<PortKey>::new(name, id, table, ProtoFamily::Inet);
            emit_set(batch, descriptions, set, s, rule_text)
        }
        nft_ir::SetKey::Ipv6Addr => {
            let set = Set::<V6Key>::new(name, id, table, ProtoFamily::Inet);
            emit_set(batch, descriptions, set, s, rule_text)
        }
        _ => {
            let set = Set::<V4Key>::new(name, id, table, ProtoFamily::Inet);
            emit_set(batch, descriptions, set, s, rule_text)
        }
    }
}

fn emit_set<K>(
    batch: &mut Batch,
    descriptions: &mut impl Notes,
    set: Set<'_, K>,
    s: &nft_ir::Set,
    rule_text: impl Fn() -> String,
) {
    // SAFETY: `set` owns a valid nftnl_set; libnftnl takes ownership of each element added.
    unsafe {
        let raw = set.as_ptr().as_ptr();
        if s.interval {
            let flags =
                (libc::NFT_SET_ANONYMOUS | libc::NFT_SET_CONSTANT | libc::NFT_SET_INTERVAL) as u32;
            sys::nftnl_set_set_u32(raw, sys::NFTNL_SET_FLAGS as u16, flags);
        }
        for (key, end) in &s.elements {
            let e = elem_with_key(key);
            if *end {
                sys::nftnl_set_elem_set_u32(
                    e,
                    sys::NFTNL_SET_ELEM_FLAGS as u16,
                    libc::NFT_SET_ELEM_INTERVAL_END as u32,
                );
            }
            sys::nftnl_set_elem_add(raw, e);
        }
    }
    batch.add(&set, MsgType::Add);
    descriptions.note(|| format!("the set of rule `{}`", rule_text()));
    for msg in set.elems_iter() {
        batch.add(&msg, MsgType::Add);
        descriptions.note(|| format!("the elements of the set of rule `{}`", rule_text()));
    }
}

/// A new `inet` set object named `name` in `table` (libnftnl copies both strings).
///
/// # Safety
/// The caller must free the set (`nftnl_set_free`) or hand it to libnftnl.
unsafe fn named_set(table: &str, name: &str) -> *mut sys::nftnl_set {
    let (t, n) = (cstr(table), cstr(name));
    // SAFETY: a fresh set; the strings are copied before `t` and `n` are dropped.
    unsafe {
        let set = sys::nftnl_set_alloc();
        if set.is_null() {
            std::process::abort();
        }
        sys::nftnl_set_set_u32(set, sys::NFTNL_SET_FAMILY as u16, libc::NFPROTO_INET as u32);
        sys::nftnl_set_set_str(set, sys::NFTNL_SET_TABLE as u16, t.as_ptr());
        sys::nftnl_set_set_str(set, sys::NFTNL_SET_NAME as u16, n.as_ptr());
        set
    }
}

/// A new set element (for `nftnl_set_elem_add`, which takes ownership) holding `key`.
///
/// # Safety
/// The caller must hand the element to a set or free it.
unsafe fn elem_with_key(key: &[u8]) -> *mut sys::nftnl_set_elem {
    // SAFETY: a fresh element, and `key` outlives the copy libnftnl makes of it.
    unsafe {
        let e = sys::nftnl_set_elem_alloc();
        if e.is_null() {
            std::process::abort();
        }
        sys::nftnl_set_elem_set(
            e,
            sys::NFTNL_SET_ELEM_KEY as u16,
            key.as_ptr().cast(),
            key.len() as u32,
        );
        e
    }
}

/// A batch deleting `tables`.
pub fn delete(tables: &[Table]) -> FinalizedBatch {
    let mut batch = Batch::new();
    for t in tables {
        batch.add(
            &nftnl::Table::new(cstr(t.nft_name()), ProtoFamily::Inet),
            MsgType::Del,
        );
    }
    batch.finalize()
}

/// Userdata TLV as libnftnl's `nftnl_udata_put_strz` writes it: type, length, NUL-ended text.
fn udata_comment(kind: u32, text: &str) -> Vec<u8> {
    let text = &text.as_bytes()[..text.len().min(126)];
    let mut out = vec![kind as u8, (text.len() + 1) as u8];
    out.extend_from_slice(text);
    out.push(0);
    out
}

/// `add set inet T NAME { type KEY; [flags interval;] comment "…"; }`: idempotent (no EXCL).
struct NamedSetMsg(*mut sys::nftnl_set);

impl NamedSetMsg {
    fn new(table: &str, s: &nft_ir::Set, id: u32) -> Self {
        let (kind, len) = (s.key.id(), s.key.key_len());
        let comment = s
            .comment
            .as_deref()
            .map(|c| udata_comment(sys::NFTNL_UDATA_SET_COMMENT, c));
        // SAFETY: a fresh nftnl_set; libnftnl copies every string and buffer set on it.
        unsafe {
            let set = named_set(table, &s.name);
            sys::nftnl_set_set_u32(set, sys::NFTNL_SET_ID as u16, id);
            sys::nftnl_set_set_u32(set, sys::NFTNL_SET_KEY_TYPE as u16, kind);
            sys::nftnl_set_set_u32(set, sys::NFTNL_SET_KEY_LEN as u16, len);
            if s.interval {
                let flags = libc::NFT_SET_INTERVAL as u32;
                sys::nftnl_set_set_u32(set, sys::NFTNL_SET_FLAGS as u16, flags);
            }
            if let Some(comment) = comment {
                sys::nftnl_set_set_data(
                    set,
                    sys::NFTNL_SET_USERDATA as u16,
                    comment.as_ptr().cast(),
                    comment.len() as u32,
                );
            }
            Self(set)
        }
    }
}

impl Drop for NamedSetMsg {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        unsafe { sys::nftnl_set_free(self.0) }
    }
}

// SAFETY: writes one complete NEWSET message into the batch buffer nftnl provides.
unsafe impl nftnl::NlMsg for NamedSetMsg {
    unsafe fn write(&self, buf: *mut libc::c_void, seq: u32, _: MsgType) {
        // SAFETY: `buf` has room for one message (nftnl's batch contract).
        unsafe {
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf.cast(),
                libc::NFT_MSG_NEWSET as u16,
                libc::NFPROTO_INET as u16,
                (libc::NLM_F_CREATE | libc::NLM_F_ACK) as u16,
                seq,
            );
            sys::nftnl_set_nlmsg_build_payload(hdr, self.0);
        }
    }
}

/// `flush table inet T`: a rule deletion naming only the table removes every rule in it.
struct FlushTableRules(CString);

// SAFETY: writes one complete DELRULE message into the batch buffer nftnl provides.
unsafe impl nftnl::NlMsg for FlushTableRules {
    unsafe fn write(&self, buf: *mut libc::c_void, seq: u32, _: MsgType) {
        // SAFETY: a fresh rule object, freed after its payload is written.
        unsafe {
            let r = sys::nftnl_rule_alloc();
            if r.is_null() {
                std::process::abort();
            }
            sys::nftnl_rule_set_u32(r, sys::NFTNL_RULE_FAMILY as u16, libc::NFPROTO_INET as u32);
            sys::nftnl_rule_set_str(r, sys::NFTNL_RULE_TABLE as u16, self.0.as_ptr());
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf.cast(),
                libc::NFT_MSG_DELRULE as u16,
                libc::NFPROTO_INET as u16,
                libc::NLM_F_ACK as u16,
                seq,
            );
            sys::nftnl_rule_nlmsg_build_payload(hdr, r);
            sys::nftnl_rule_free(r);
        }
    }
}

/// Elements to add to or remove from a named set: `(address bytes, comment)`.
pub struct SetElements<'a> {
    pub table: &'a str,
    pub set: &'a str,
    pub elements: Vec<(Vec<u8>, Option<String>)>,
}

// SAFETY: writes one complete NEWSETELEM/DELSETELEM message into nftnl's batch buffer.
unsafe impl nftnl::NlMsg for SetElements<'_> {
    unsafe fn write(&self, buf: *mut libc::c_void, seq: u32, msg_type: MsgType) {
        // SAFETY: a fresh set object holding the elements, freed after the payload is written.
        unsafe {
            let set = named_set(self.table, self.set);
            for (key, comment) in &self.elements {
                let e = elem_with_key(key);
                if let Some(c) = comment {
                    let u = udata_comment(sys::NFTNL_UDATA_SET_ELEM_COMMENT, c);
                    sys::nftnl_set_elem_set(
                        e,
                        sys::NFTNL_SET_ELEM_USERDATA as u16,
                        u.as_ptr().cast(),
                        u.len() as u32,
                    );
                }
                sys::nftnl_set_elem_add(set, e);
            }
            let (kind, flags) = match msg_type {
                // No EXCL: adding an element that is there already is not an error.
                MsgType::Add => (libc::NFT_MSG_NEWSETELEM, libc::NLM_F_CREATE),
                MsgType::Del => (libc::NFT_MSG_DELSETELEM, 0),
            };
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf.cast(),
                kind as u16,
                libc::NFPROTO_INET as u16,
                (flags | libc::NLM_F_ACK) as u16,
                seq,
            );
            sys::nftnl_set_elems_nlmsg_build_payload(hdr, set);
            sys::nftnl_set_free(set);
        }
    }
}

/// One batch adding set elements (adding one that is there already is not an error).
pub fn add_elements(msg: &SetElements<'_>) -> FinalizedBatch {
    set_elements_sync(std::slice::from_ref(msg), &[])
}

/// One batch removing set elements (all of them must be there).
pub fn remove_elements(msg: &SetElements<'_>) -> FinalizedBatch {
    set_elements_sync(&[], std::slice::from_ref(msg))
}

/// One atomic batch adding the elements of `add` and removing those of `del` (any sets).
pub fn set_elements_sync(add: &[SetElements<'_>], del: &[SetElements<'_>]) -> FinalizedBatch {
    let mut batch = Batch::new();
    for msg in add {
        batch.add(msg, MsgType::Add);
    }
    for msg in del {
        batch.add(msg, MsgType::Del);
    }
    batch.finalize()
}
