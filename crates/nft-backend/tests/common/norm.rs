//! Turns an `nft list ruleset` text into comparable rules.
//!
//! Both sides: the listing is split into tables → chains (base-chain `type … policy` line kept
//! verbatim) → rules; each rule is tokenised into match clauses (`selector [!=] value`) and
//! statements (`redirect to :15001`, `meta mark set 0x…`, `jump x`, …). `counter …` is
//! dropped (Istio writes one on every rule, §2.3 item 5; ours too, deviation 3). Match
//! clauses are a conjunction, so they are sorted (our clause order differs from Istio's);
//! statements keep their order.
//!
//! Our side only, one step per deviation in nft/DEVIATIONS.md:
//! * 3: comments are dropped (Istio's listing must have none).
//! * 5: the fail-closed `drop` right after each `tproxy … accept` rule, with the same matches,
//!   is dropped (and must be there).
//! * 1: `meta nfproto` guards are dropped. With IPv6 off they must say `ipv4`, and every
//!   base-chain rule that does more than `return` must be IPv4-only. With IPv6 on, a guard is
//!   only dropped where it cannot be observed: on a `jump` to a chain whose rules all match
//!   that family by address; and a rule the plan has for both families (listed as an `ipv4`
//!   and an `ipv6` twin) becomes Istio's one family-agnostic rule when the twins can be
//!   brought together by commuting swaps. (Istio never writes `meta nfproto`; any other
//!   guard is left in and shows as a difference.)
//! * 6: our `ct state invalid` rule matches every protocol; Istio's only TCP: `meta l4proto
//!   tcp` is added to ours.
//! * 4: `meta skgid <gid>` is written with the group name the config resolved to that gid.
//! * 2: a positive set `{ a, b }` becomes one rule per element (negative sets stay: Istio
//!   writes those too).
//!
//! Order ([`compare`]): two chains are equal when they hold the same rules and every pair of
//! rules whose order can matter is in the same order. Adjacent rules commute when no packet
//! can match both (different family, L4 protocol, port, address range, interface, uid/gid:
//! fields no statement here rewrites), or when they do exactly the same thing and neither the
//! statement nor the matches involve a mark. That covers Istio's per-element rules against
//! our set rules (e.g. the TPROXY per-port divert/tproxy pairs), its v4/v6 rules interleaved
//! in one inet chain, and its insert order of the mangle `istio-inbound` returns.
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Clause {
    pub sel: String,
    pub neg: bool,
    pub val: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub matches: Vec<Clause>,
    pub stmts: Vec<String>,
    pub comment: Option<String>,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for m in &self.matches {
            write!(f, "{} {}{} ", m.sel, if m.neg { "!= " } else { "" }, m.val)?;
        }
        write!(f, "=> {}", self.stmts.join(" "))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// `type … hook … priority …; policy …;` for base chains.
    pub base: Option<String>,
    pub rules: Vec<Rule>,
}

/// (table, chain) → chain.
pub type Ruleset = BTreeMap<(String, String), Chain>;

/// Splits a line into words; `"…"` and `{ … }` are one word each.
pub fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = line.trim().chars().peekable();
    while let Some(&c) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        let close = match c {
            '"' => Some('"'),
            '{' => Some('}'),
            _ => None,
        };
        let mut w = String::new();
        w.push(c);
        it.next();
        for c in it.by_ref() {
            if close.is_none() && c.is_whitespace() {
                break;
            }
            w.push(c);
            if Some(c) == close {
                break;
            }
        }
        out.push(w);
    }
    out
}

/// Parses one rule line. Unknown syntax panics: nothing is skipped silently.
pub fn rule(line: &str) -> Rule {
    let w = words(line);
    let mut r = Rule {
        matches: Vec::new(),
        stmts: Vec::new(),
        comment: None,
    };
    let mut i = 0;
    let at = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    while i < w.len() {
        match at(i) {
            "counter" => {
                i += 1;
                if at(i) == "packets" && at(i + 2) == "bytes" {
                    i += 4;
                }
            }
            "comment" => {
                r.comment = Some(at(i + 1).trim_matches('"').to_string());
                i += 2;
            }
            "return" | "accept" | "drop" => {
                r.stmts.push(at(i).to_string());
                i += 1;
            }
            "jump" | "goto" => {
                r.stmts.push(format!("{} {}", at(i), at(i + 1)));
                i += 2;
            }
            // redirect to :P
            "redirect" => {
                r.stmts.push(w[i..i + 3].join(" "));
                i += 3;
            }
            // tproxy ip to :P
            "tproxy" => {
                r.stmts.push(w[i..i + 4].join(" "));
                i += 4;
            }
            // meta mark set 0x…, meta mark set ct mark, ct mark set meta mark, ct zone set N,
            // ct mark set ct mark & 0xfffff000 | 0x00000111
            "meta" | "ct" if at(i + 2) == "set" => {
                let mut n = if matches!(at(i + 3), "meta" | "ct") {
                    5
                } else {
                    4
                };
                while matches!(at(i + n), "&" | "|" | "^") {
                    n += 2;
                }
                r.stmts.push(w[i..i + n].join(" "));
                i += n;
            }
            // snat ip to 169.254.7.127
            "snat" | "dnat" => {
                r.stmts.push(w[i..i + 4].join(" "));
                i += 4;
            }
            "iifname" | "oifname" | "meta" | "ct" | "ip" | "ip6" | "tcp" | "udp" | "th" => {
                let one_word = matches!(at(i), "iifname" | "oifname");
                let sel = if one_word {
                    at(i).to_string()
                } else {
                    format!("{} {}", at(i), at(i + 1))
                };
                i += if one_word { 1 } else { 2 };
                // `meta mark & 0x00000fff != 0x00000539`: the mask is part of the selector.
                let sel = if at(i) == "&" {
                    i += 2;
                    format!("{sel} & {}", at(i - 1))
                } else {
                    sel
                };
                let neg = at(i) == "!=";
                if neg || at(i) == "==" {
                    i += 1;
                }
                assert!(i < w.len(), "no value after {sel:?} in {line:?}");
                r.matches.push(Clause {
                    sel,
                    neg,
                    val: at(i).to_string(),
                });
                i += 1;
            }
            other => panic!("unknown word {other:?} in rule {line:?}"),
        }
    }
    r
}

/// Parses a whole `nft list ruleset`.
pub fn parse(listing: &str) -> Ruleset {
    let mut out = Ruleset::new();
    let (mut table, mut chain) = (None::<String>, None::<String>);
    let mut in_set: Option<String> = None;
    for line in listing.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let Some(set) = in_set.clone() {
            // A named set is kept as a pseudo-chain `set NAME` whose `base` is its type;
            // its comment and elements are not compared.
            match w.as_slice() {
                ["}"] => in_set = None,
                ["type", ..] => {
                    let key = (table.clone().unwrap(), set.clone());
                    out.get_mut(&key).unwrap().base = Some(line.to_string());
                }
                _ => {}
            }
            continue;
        }
        match w.as_slice() {
            ["table", family, name, "{"] => table = Some(format!("{family} {name}")),
            ["set", name, "{"] => {
                let key = format!("set {name}");
                out.entry((table.clone().unwrap(), key.clone()))
                    .or_default();
                in_set = Some(key);
            }
            ["chain", name, "{"] => {
                chain = Some(name.to_string());
                out.entry((table.clone().unwrap(), name.to_string()))
                    .or_default();
            }
            ["}"] => {
                if chain.take().is_none() {
                    table = None;
                }
            }
            ["type", ..] => {
                let key = (table.clone().unwrap(), chain.clone().unwrap());
                out.get_mut(&key).unwrap().base = Some(line.to_string());
            }
            _ => {
                let key = (
                    table.clone().expect("rule outside a table"),
                    chain.clone().expect("rule outside a chain"),
                );
                out.get_mut(&key).unwrap().rules.push(rule(line));
            }
        }
    }
    out
}

fn finish(mut rs: Ruleset) -> Ruleset {
    for c in rs.values_mut() {
        for r in &mut c.rules {
            r.matches.sort();
            r.comment = None;
        }
    }
    rs
}

/// Istio's listing: parsed, counters gone, match clauses sorted. Nothing else.
pub fn istio(listing: &str) -> Ruleset {
    let rs = parse(listing);
    for c in rs.values() {
        for r in &c.rules {
            assert!(r.comment.is_none(), "Istio writes no comments: {r}");
        }
    }
    finish(rs)
}

/// What our side's normalisation needs to know about the case.
pub struct Ours<'a> {
    pub ipv6: bool,
    pub drop_invalid: bool,
    pub gid_names: &'a BTreeMap<u32, String>,
}

fn family(r: &Rule) -> Option<&'static str> {
    r.matches.iter().find_map(|m| {
        if m.sel.starts_with("ip ") {
            Some("ipv4")
        } else if m.sel.starts_with("ip6 ") {
            Some("ipv6")
        } else if m.sel == "meta nfproto" && !m.neg {
            Some(if m.val == "ipv6" { "ipv6" } else { "ipv4" })
        } else {
            None
        }
    })
}

/// Our listing with the documented deviations undone (see the module comment).
pub fn ours(listing: &str, ctx: &Ours) -> Ruleset {
    let mut rs = parse(listing);
    let snapshot = rs.clone();
    for ((table, chain), c) in rs.iter_mut() {
        let at = format!("{table} {chain}");
        // Deviation 3: every rule has a comment.
        for r in &c.rules {
            assert!(r.comment.is_some(), "{at}: rule without a comment: {r}");
        }
        // Deviation 5: tproxy … accept, then drop with the same matches.
        let mut kept: Vec<Rule> = Vec::new();
        let mut expect_drop: Option<Vec<Clause>> = None;
        for r in c.rules.drain(..) {
            if let Some(m) = expect_drop.take() {
                assert!(
                    r.matches == m && r.stmts == ["drop"],
                    "{at}: the tproxy rule is not followed by its fail-closed drop: {r}"
                );
                continue;
            }
            if r.stmts.iter().any(|s| s.starts_with("tproxy ")) {
                expect_drop = Some(r.matches.clone());
            }
            kept.push(r);
        }
        assert!(expect_drop.is_none(), "{at}: last tproxy rule has no drop");
        // Deviation 1: IPv6 off leaves IPv6 alone: every base-chain rule that does more
        // than return is IPv4-only.
        if !ctx.ipv6 && c.base.is_some() {
            for r in &kept {
                assert!(
                    r.stmts == ["return"] || family(r) == Some("ipv4"),
                    "{at}: IPv6 is off but this base-chain rule also sees IPv6: {r}"
                );
            }
        }
        for r in &mut kept {
            let guard = r.matches.iter().position(|m| m.sel == "meta nfproto");
            if let Some(g) = guard {
                let fam = r.matches[g].val.clone();
                let droppable = if !ctx.ipv6 {
                    assert_eq!(fam, "ipv4", "{at}: IPv6 is off: {r}");
                    true
                } else {
                    guard_unobservable(&snapshot, table, r, &fam)
                };
                if droppable {
                    r.matches.remove(g);
                }
            }
            // Deviation 6: ours drops invalid packets of every protocol.
            if ctx.drop_invalid
                && r.matches
                    .iter()
                    .any(|m| m.sel == "ct state" && m.val == "invalid")
                && !r.matches.iter().any(|m| m.sel == "meta l4proto")
            {
                r.matches.push(Clause {
                    sel: "meta l4proto".into(),
                    neg: false,
                    val: "tcp".into(),
                });
            }
            // Deviation 4: groups go over netlink as numbers.
            for m in &mut r.matches {
                if m.sel == "meta skgid"
                    && let Some(name) = m.val.parse().ok().and_then(|g| ctx.gid_names.get(&g))
                {
                    m.val = name.clone();
                }
            }
        }
        merge_family_twins(&mut kept);
        // Deviation 2: sets → one rule per element.
        c.rules = kept.into_iter().flat_map(expand_sets).collect();
    }
    finish(rs)
}

/// With IPv6 on, a rule our plan has for both families (e.g. `jump istio-output-dns` with
/// v4 and v6 DNS servers) is listed as an `ipv4`-guarded and an `ipv6`-guarded twin; the
/// pair is exactly Istio's one family-agnostic rule. Twins are merged at the first one's
/// place when the second can be moved up to it (it commutes with every rule in between),
/// or at the second's place when the first can be moved down.
fn merge_family_twins(rules: &mut Vec<Rule>) {
    let unguarded = |r: &Rule| Rule {
        matches: r
            .matches
            .iter()
            .filter(|m| m.sel != "meta nfproto")
            .cloned()
            .collect(),
        ..r.clone()
    };
    let guard = |r: &Rule| {
        r.matches
            .iter()
            .find(|m| m.sel == "meta nfproto" && !m.neg)
            .map(|m| m.val.clone())
    };
    let mut i = 0;
    while i < rules.len() {
        let twin = guard(&rules[i]).and_then(|g| {
            (i + 1..rules.len()).find(|&j| {
                guard(&rules[j]).is_some_and(|h| h != g)
                    && unguarded(&rules[j]) == unguarded(&rules[i])
            })
        });
        if let Some(j) = twin {
            let between = &rules[i + 1..j];
            if between.iter().all(|b| commute(b, &rules[j])) {
                rules[i] = unguarded(&rules[i]);
                rules.remove(j);
            } else if between.iter().all(|b| commute(b, &rules[i])) {
                rules[j] = unguarded(&rules[j]);
                rules.remove(i);
                continue;
            }
        }
        i += 1;
    }
}

/// With IPv6 on, a `meta nfproto F` guard on `jump X` changes nothing when every rule of X
/// matches family F by address anyway.
fn guard_unobservable(rs: &Ruleset, table: &str, r: &Rule, fam: &str) -> bool {
    let [stmt] = r.stmts.as_slice() else {
        return false;
    };
    let Some(target) = stmt.strip_prefix("jump ") else {
        return false;
    };
    rs.get(&(table.to_string(), target.to_string()))
        .is_some_and(|c| c.rules.iter().all(|t| family(t) == Some(fam)))
}

/// A rule with positive set matches, as one rule per element (cartesian product).
pub fn expand_sets(r: Rule) -> Vec<Rule> {
    let Some(i) = r
        .matches
        .iter()
        .position(|m| !m.neg && m.val.starts_with('{'))
    else {
        return vec![r];
    };
    let inner = r.matches[i].val.trim_matches(|c| c == '{' || c == '}');
    inner
        .split(',')
        .map(str::trim)
        .flat_map(|e| {
            let mut one = r.clone();
            one.matches[i].val = e.to_string();
            expand_sets(one)
        })
        .collect()
}

fn value_of<'a>(r: &'a Rule, sel: &str) -> Option<&'a Clause> {
    r.matches.iter().find(|m| m.sel == sel)
}

fn l4(r: &Rule) -> Option<&str> {
    r.matches.iter().find_map(|m| match m.sel.as_str() {
        "meta l4proto" if !m.neg => Some(m.val.as_str()),
        s if s.starts_with("tcp ") => Some("tcp"),
        s if s.starts_with("udp ") => Some("udp"),
        _ => None,
    })
}

/// `a/len` as (bits, len) for overlap tests.
fn net(v: &str) -> Option<(u128, u32, u32)> {
    let (a, len) = v.split_once('/').unwrap_or((v, ""));
    let ip: std::net::IpAddr = a.parse().ok()?;
    let (bits, width) = match ip {
        std::net::IpAddr::V4(a) => (u32::from(a) as u128, 32),
        std::net::IpAddr::V6(a) => (u128::from(a), 128),
    };
    let len = if len.is_empty() {
        width
    } else {
        len.parse().ok()?
    };
    Some((bits, len, width))
}

fn overlap(a: &str, b: &str) -> bool {
    match (net(a), net(b)) {
        (Some((x, lx, w)), Some((y, ly, _))) => {
            let l = lx.min(ly);
            let shift = w - l;
            shift >= 128 || (x >> shift) == (y >> shift)
        }
        _ => true,
    }
}

/// No packet can match both rules (on fields no statement here rewrites).
fn disjoint(a: &Rule, b: &Rule) -> bool {
    let (fa, fb) = (family(a), family(b));
    if fa.is_some() && fb.is_some() && fa != fb {
        return true;
    }
    let (la, lb) = (l4(a), l4(b));
    if la.is_some() && lb.is_some() && la != lb {
        return true;
    }
    const FIXED: [&str; 10] = [
        "iifname",
        "oifname",
        "tcp dport",
        "tcp sport",
        "udp dport",
        "udp sport",
        "meta skuid",
        "meta skgid",
        "ip daddr",
        "ip saddr",
    ];
    let addr6 = ["ip6 daddr", "ip6 saddr"];
    for sel in FIXED.iter().chain(addr6.iter()) {
        let (Some(x), Some(y)) = (value_of(a, sel), value_of(b, sel)) else {
            continue;
        };
        if x.neg || y.neg || x.val.contains(['{', '*', '-']) || y.val.contains(['{', '*', '-']) {
            continue;
        }
        let differ = if sel.contains("addr") {
            !overlap(&x.val, &y.val)
        } else {
            x.val != y.val
        };
        if differ {
            return true;
        }
    }
    false
}

fn touches_mark(r: &Rule) -> bool {
    r.matches.iter().any(|m| m.sel.ends_with(" mark"))
}

fn may_write(r: &Rule) -> bool {
    r.stmts
        .iter()
        .any(|s| s.contains(" set ") || s.starts_with("jump ") || s.starts_with("goto "))
}

/// Whether swapping two adjacent rules can never change what happens to a packet.
pub fn commute(a: &Rule, b: &Rule) -> bool {
    disjoint(a, b)
        || (a.stmts == b.stmts && !(may_write(a) && (touches_mark(a) || touches_mark(b))))
}

/// Differences between two chains' rule lists, modulo swaps of commuting rules: same
/// rules (as a multiset), and every non-commuting pair in the same order.
pub fn compare_rules(istio: &[Rule], ours: &[Rule]) -> Vec<String> {
    let mut problems = Vec::new();
    let (mut a, mut b) = (istio.to_vec(), ours.to_vec());
    a.sort();
    b.sort();
    if a != b {
        for r in &a {
            let (na, nb) = (
                a.iter().filter(|x| *x == r).count(),
                b.iter().filter(|x| *x == r).count(),
            );
            if na > nb && !problems.contains(&format!("only Istio has: {r}")) {
                problems.push(format!("only Istio has: {r}"));
            }
        }
        for r in &b {
            let (na, nb) = (
                a.iter().filter(|x| *x == r).count(),
                b.iter().filter(|x| *x == r).count(),
            );
            if nb > na && !problems.contains(&format!("only we have: {r}")) {
                problems.push(format!("only we have: {r}"));
            }
        }
        return problems;
    }
    // Position in `ours` of the k-th occurrence of each rule of `istio`.
    let mut used = vec![false; ours.len()];
    let pos: Vec<usize> = istio
        .iter()
        .map(|r| {
            let p = (0..ours.len())
                .find(|&j| !used[j] && ours[j] == *r)
                .unwrap();
            used[p] = true;
            p
        })
        .collect();
    for i in 0..istio.len() {
        for j in i + 1..istio.len() {
            if pos[i] > pos[j] && !commute(&istio[i], &istio[j]) {
                problems.push(format!(
                    "order: Istio evaluates [{}] before [{}], we evaluate it after",
                    istio[i], istio[j]
                ));
            }
        }
    }
    problems
}

/// Differences between two normalised rulesets (empty = equivalent).
pub fn compare(istio: &Ruleset, ours: &Ruleset) -> Vec<String> {
    let mut problems = Vec::new();
    let keys: std::collections::BTreeSet<_> = istio.keys().chain(ours.keys()).collect();
    for key in keys {
        let at = format!("{} {}", key.0, key.1);
        match (istio.get(key), ours.get(key)) {
            (Some(_), None) => problems.push(format!("{at}: only Istio has this chain")),
            (None, Some(_)) => problems.push(format!("{at}: only we have this chain")),
            (Some(a), Some(b)) => {
                if a.base != b.base {
                    problems.push(format!(
                        "{at}: base chain {:?} vs ours {:?}",
                        a.base, b.base
                    ));
                }
                for p in compare_rules(&a.rules, &b.rules) {
                    problems.push(format!("{at}: {p}"));
                }
            }
            (None, None) => unreachable!(),
        }
    }
    problems
}
