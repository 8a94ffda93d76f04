use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt;

/// Whether a name is looked up in /etc/passwd or /etc/group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    User,
    Group,
}

/// A user or group as the admin wrote it, plus the number the kernel matches on.
///
/// iptables resolves names itself, so the legacy backend prints `given`; netlink carries only
/// numbers, so the nft backend uses `id`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Id {
    pub given: String,
    pub id: u32,
}

impl Id {
    pub fn numeric(id: u32) -> Self {
        Self {
            given: id.to_string(),
            id,
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.given)
    }
}

/// Name → number tables parsed from passwd(5) and group(5) text: given up front, or loaded
/// the first time a name has to be resolved (the usual invocation passes numbers only, and
/// parsing the files cost a tenth of the CLI's instructions).
#[derive(Clone, Debug, Default)]
pub struct IdDb {
    tables: OnceCell<Tables>,
    /// Reads (passwd, group) text when a name is first looked up.
    load: Option<fn() -> (String, String)>,
}

#[derive(Clone, Debug, Default)]
struct Tables {
    users: HashMap<String, u32>,
    groups: HashMap<String, u32>,
}

impl IdDb {
    /// Parses the contents of /etc/passwd and /etc/group (malformed lines are skipped, as libc does).
    pub fn parse(passwd: &str, group: &str) -> Self {
        Self {
            tables: OnceCell::from(Tables::parse(passwd, group)),
            load: None,
        }
    }

    /// Tables `load` returns the text of (passwd, group), called only if a name is looked up.
    pub fn on_demand(load: fn() -> (String, String)) -> Self {
        Self {
            tables: OnceCell::new(),
            load: Some(load),
        }
    }

    fn tables(&self) -> &Tables {
        self.tables.get_or_init(|| {
            let (passwd, group) = self.load.map(|load| load()).unwrap_or_default();
            Tables::parse(&passwd, &group)
        })
    }

    pub fn lookup(&self, kind: IdKind, name: &str) -> Option<u32> {
        let tables = self.tables();
        match kind {
            IdKind::User => tables.users.get(name).copied(),
            IdKind::Group => tables.groups.get(name).copied(),
        }
    }

    /// A number passes through; a name must exist in the database.
    pub fn resolve(&self, kind: IdKind, given: &str) -> Result<Id, IdError> {
        let given = given.to_string();
        if let Ok(id) = given.parse::<u32>() {
            if id == u32::MAX {
                // (uid_t)-1 / (gid_t)-1: no socket has it, and iptables' owner match refuses
                // it (the nft backend would accept it): refused up front for both backends.
                return Err(IdError::Unassignable { kind, given });
            }
            return Ok(Id { given, id });
        }
        let valid_name = !given.is_empty()
            && given
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-$".contains(&b));
        if !valid_name {
            return Err(IdError::InvalidName { given });
        }
        match self.lookup(kind, &given) {
            Some(id) => Ok(Id { given, id }),
            None => Err(IdError::Unknown { kind, given }),
        }
    }
}

/// A user or group that cannot be matched on; each names the value as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{given} is ({})-1, which no process can have", kind.c_type())]
    Unassignable { kind: IdKind, given: String },
    #[error("{given:?} is neither a number nor a valid name")]
    InvalidName { given: String },
    #[error("no {kind} named {given:?} in {}", kind.database())]
    Unknown { kind: IdKind, given: String },
}

impl IdKind {
    /// The C type of the number (`uid_t`, `gid_t`).
    fn c_type(self) -> &'static str {
        match self {
            IdKind::User => "uid_t",
            IdKind::Group => "gid_t",
        }
    }

    /// The database names are looked up in.
    fn database(self) -> &'static str {
        match self {
            IdKind::User => "/etc/passwd",
            IdKind::Group => "/etc/group",
        }
    }
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::User => "user",
            IdKind::Group => "group",
        })
    }
}

impl Tables {
    fn parse(passwd: &str, group: &str) -> Self {
        Self {
            users: parse_db(passwd),
            groups: parse_db(group),
        }
    }
}

fn parse_db(text: &str) -> HashMap<String, u32> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let _password = f.next()?;
            let id = f.next()?.parse().ok()?;
            (!name.is_empty()).then(|| (name.to_string(), id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_and_numbers() {
        let db = IdDb::parse(
            "root:x:0:0::/root:/bin/sh\nistio-proxy:x:1337:1337::/:/bin/false\n",
            "java:x:901:\n",
        );
        assert_eq!(db.resolve(IdKind::User, "istio-proxy").unwrap().id, 1337);
        assert_eq!(db.resolve(IdKind::User, "42").unwrap(), Id::numeric(42));
        assert_eq!(db.resolve(IdKind::Group, "java").unwrap().id, 901);
        let refused = |kind, given| db.resolve(kind, given).unwrap_err().to_string();
        assert_eq!(
            refused(IdKind::Group, "nope"),
            "no group named \"nope\" in /etc/group"
        );
        assert_eq!(
            refused(IdKind::User, "a b"),
            "\"a b\" is neither a number nor a valid name"
        );
        assert_eq!(
            refused(IdKind::User, "4294967295"),
            "4294967295 is (uid_t)-1, which no process can have"
        );
        assert_eq!(
            refused(IdKind::Group, "4294967295"),
            "4294967295 is (gid_t)-1, which no process can have"
        );
        assert_eq!(
            db.resolve(IdKind::Group, "4294967294").unwrap().id,
            4294967294
        );
    }

    #[test]
    fn on_demand_tables_are_loaded_for_the_first_name_only() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        let db = IdDb::on_demand(|| {
            LOADS.fetch_add(1, Ordering::SeqCst);
            (
                "envoy:x:1337:1337::/:/bin/false\n".into(),
                "proxy:x:7:\n".into(),
            )
        });
        assert_eq!(db.resolve(IdKind::User, "1337").unwrap(), Id::numeric(1337));
        assert_eq!(LOADS.load(Ordering::SeqCst), 0, "numbers need no tables");
        assert_eq!(db.resolve(IdKind::User, "envoy").unwrap().id, 1337);
        assert_eq!(db.resolve(IdKind::Group, "proxy").unwrap().id, 7);
        assert_eq!(LOADS.load(Ordering::SeqCst), 1);
    }
}
