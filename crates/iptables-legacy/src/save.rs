//! Reading `iptables-save` output: tables, chains, rules in order.
//!
//! iptables-save prints every rule in a canonical form (`-p tcp -m tcp --dport …`, marks in
//! hex, …) that differs from how Istio writes them, so comparisons are always made between
//! two save outputs, never between a save output and a restore payload.

/// Chains we own in a pod's namespace: every `ISTIO_*` chain (the same test Istio's residue
/// detection uses).
pub(crate) fn is_ours(chain: &str) -> bool {
    chain.starts_with("ISTIO_")
}

/// What a caller owns where it works. In a pod's namespace ([`Owns::POD`]): every chain
/// [`is_ours`] accepts and, in built-in chains, the rules of [`is_builtin_shape`]. In the
/// node's own namespace only the host probe chain (`ambient_host`): never another `ISTIO_*`
/// chain, nor a rule of those shapes. A jump to an owned chain is owned wherever it stands.
#[derive(Clone, Copy)]
pub(crate) struct Owns {
    pub(crate) chain: fn(&str) -> bool,
    pub(crate) builtin_shapes: bool,
}

impl Owns {
    pub(crate) const POD: Owns = Owns {
        chain: is_ours,
        builtin_shapes: true,
    };

    /// Whether `rule`, in `table`'s `chain` (a chain not owned), is owned: a jump to an owned
    /// chain, or one of the built-in shapes where those count.
    pub(crate) fn rule(&self, table: &str, chain: &str, rule: &str) -> bool {
        jump_target(rule).is_some_and(self.chain)
            || (self.builtin_shapes && is_builtin_shape(table, chain, rule))
    }
}

/// Whether `rule` (save form) in the built-in `chain` of `table` has the shape of a rule
/// Istio's builder writes straight into a built-in chain, with no jump into ours: `-c`/`-k`
/// interface RETURNs (nat, mangle) and TPROXY's mark rules (mangle). In a pod's namespace
/// such a rule is ours even when the current plan has none: the plan that wrote it may have
/// been replaced (a reconfiguration), and a leftover RETURN lets traffic bypass the proxy.
/// Never used in the node's own namespace, whose rules are kube-proxy's and others'.
pub(crate) fn is_builtin_shape(table: &str, chain: &str, rule: &str) -> bool {
    let t: Vec<&str> = rule.split_whitespace().collect();
    let starts =
        |p: &[&str]| t.len() >= p.len() && t.iter().zip(p).all(|(a, b)| b.is_empty() || a == b);
    let is = |p: &[&str]| t.len() == p.len() && starts(p);
    // "" stands for any one token (an interface, a mark, an id, an address).
    match (table, chain) {
        ("nat" | "mangle", "PREROUTING") if is(&["-i", "", "-j", "RETURN"]) => true,
        ("nat" | "mangle", "OUTPUT") if is(&["-o", "", "-j", "RETURN"]) => true,
        ("mangle", "PREROUTING") => starts(&[
            "-p",
            "tcp",
            "-m",
            "mark",
            "--mark",
            "",
            "-j",
            "CONNMARK",
            "--save-mark",
        ]),
        ("mangle", "OUTPUT") => {
            is(&[
                "-o", "lo", "-p", "tcp", "-m", "mark", "--mark", "", "-j", "RETURN",
            ]) || starts(&[
                "-p",
                "tcp",
                "-m",
                "connmark",
                "--mark",
                "",
                "-j",
                "CONNMARK",
                "--restore-mark",
            ]) || ["--uid-owner", "--gid-owner"].iter().any(|owner| {
                is(&[
                    "!",
                    "-d",
                    "",
                    "-o",
                    "lo",
                    "-p",
                    "tcp",
                    "-m",
                    "owner",
                    owner,
                    "",
                    "-j",
                    "MARK",
                    "--set-xmark",
                    "",
                ])
            })
        }
        _ => false,
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedTable {
    pub name: String,
    /// Every chain declared (`:NAME POLICY [..]`), built-in ones first as printed.
    pub chains: Vec<String>,
    /// `(chain, rule text after "-A CHAIN ")`, in order.
    pub rules: Vec<(String, String)>,
}

impl SavedTable {
    pub fn rules_of<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules
            .iter()
            .filter(move |(c, _)| c == chain)
            .map(|(_, r)| r.as_str())
    }

    pub fn our_chains(&self) -> impl Iterator<Item = &str> {
        self.owned_chains(Owns::POD)
    }

    /// Whether anything of ours is in this table, in a pod's namespace: a chain, a jump to
    /// one, or a rule of the shapes Istio writes into built-in chains.
    pub fn has_ours(&self) -> bool {
        self.has_owned(Owns::POD)
    }

    pub(crate) fn owned_chains(&self, owns: Owns) -> impl Iterator<Item = &str> {
        self.chains
            .iter()
            .map(String::as_str)
            .filter(move |c| (owns.chain)(c))
    }

    /// Whether a chain or a rule `owns` accepts is in this table.
    pub(crate) fn has_owned(&self, owns: Owns) -> bool {
        self.owned_chains(owns).next().is_some()
            || self
                .rules
                .iter()
                .any(|(c, r)| !(owns.chain)(c) && owns.rule(&self.name, c, r))
    }
}

/// Parses iptables-save output; unknown lines (comments, `COMMIT`) are skipped.
pub fn parse(text: &str) -> Vec<SavedTable> {
    let mut tables: Vec<SavedTable> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push(SavedTable {
                name: name.trim().to_string(),
                ..Default::default()
            });
        } else if let Some(t) = tables.last_mut() {
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(chain) = decl.split_whitespace().next() {
                    t.chains.push(chain.to_string());
                }
            } else if let Some(rest) = line.strip_prefix("-A ")
                && let Some((chain, rule)) = rest.split_once(' ')
            {
                t.rules.push((chain.to_string(), rule.to_string()));
            }
        }
    }
    tables
}

/// The chain a rule jumps or goes to (`-j X` / `-g X`), if any.
pub(crate) fn jump_target(rule: &str) -> Option<&str> {
    let mut it = rule.split_whitespace();
    while let Some(tok) = it.next() {
        if tok == "-j" || tok == "-g" {
            return it.next();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "# Generated by iptables-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_INBOUND - [0:0]\n:FOREIGN - [0:0]\n-A PREROUTING -p tcp -j ISTIO_INBOUND\n-A OUTPUT -j FOREIGN\n-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN\nCOMMIT\n*raw\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";

    #[test]
    fn parses_tables_chains_and_rules() {
        let t = parse(SAVE);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "nat");
        assert_eq!(
            t[0].chains,
            ["PREROUTING", "OUTPUT", "ISTIO_INBOUND", "FOREIGN"]
        );
        assert_eq!(t[0].our_chains().collect::<Vec<_>>(), ["ISTIO_INBOUND"]);
        assert_eq!(
            t[0].rules_of("ISTIO_INBOUND").collect::<Vec<_>>(),
            ["-p tcp -m tcp --dport 15008 -j RETURN"]
        );
        assert!(t[0].has_ours());
        assert!(!t[1].has_ours());
    }

    #[test]
    fn built_in_shapes_are_istios_direct_rules_only() {
        for (table, chain, rule) in [
            ("nat", "PREROUTING", "-i eth0 -j RETURN"),
            ("nat", "OUTPUT", "-o eth0 -j RETURN"),
            ("mangle", "PREROUTING", "-i eth0 -j RETURN"),
            (
                "mangle",
                "PREROUTING",
                "-p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff",
            ),
            (
                "mangle",
                "OUTPUT",
                "-o lo -p tcp -m mark --mark 0x539 -j RETURN",
            ),
            (
                "mangle",
                "OUTPUT",
                "! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
            ),
            (
                "mangle",
                "OUTPUT",
                "! -d ::1/128 -o lo -p tcp -m owner --gid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
            ),
            (
                "mangle",
                "OUTPUT",
                "-p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
            ),
        ] {
            assert!(
                is_builtin_shape(table, chain, rule),
                "{table} {chain} {rule}"
            );
        }
        for (table, chain, rule) in [
            ("nat", "PREROUTING", "-i eth0 -p tcp -j RETURN"),
            ("nat", "OUTPUT", "-p tcp -m tcp --dport 9999 -j RETURN"),
            ("nat", "POSTROUTING", "-o eth0 -j RETURN"),
            ("filter", "INPUT", "-i eth0 -j RETURN"),
            ("nat", "PREROUTING", "-i eth0 -j ACCEPT"),
            (
                "mangle",
                "OUTPUT",
                "-o eth0 -p tcp -m mark --mark 0x539 -j RETURN",
            ),
        ] {
            assert!(
                !is_builtin_shape(table, chain, rule),
                "{table} {chain} {rule}"
            );
        }
    }

    #[test]
    fn jump_targets() {
        assert_eq!(jump_target("-p tcp -j ISTIO_X"), Some("ISTIO_X"));
        assert_eq!(jump_target("-g ISTIO_Y"), Some("ISTIO_Y"));
        assert_eq!(jump_target("-p tcp"), None);
    }
}
