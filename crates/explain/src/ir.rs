//! The ruleset as the evaluator sees it: `nft_ir`'s types (chains with their hook and priority,
//! rules as the kernel's expression lists, the sets rules look up), which the nft dump and the
//! iptables-legacy reader both produce, so one evaluator explains both backends.

pub use nft_ir::{
    Backend, BaseHook, Chain, ChainType, Expr, Hook, Rule, Ruleset, Set, SetKey, TableFamily,
    Verdict,
};
