//! One install pass (Istio's `installAll`) and the cleanup. Every step compares before it
//! writes, so a pass over an intact install writes nothing: our own writes then cause exactly
//! one quiet re-check instead of an endless self-triggered loop, and "changes" below is the
//! list of things that were really repaired.

use crate::discovery::{self, ConfFile, ConfPlan};
use crate::gojson;
use crate::kubeconfig::{self, Trust};
use crate::owned::{self, OwnedPlan};
use crate::settings::{STANDALONE_CONF_NAME, Settings};
use node_fs::Stamp;
use node_status::metrics::Counters;
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Failure of a pass; the label is Istio's `istio_cni_installs_total{result}` value.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("copying binaries: {0}")]
    CopyBinaries(String),
    #[error("writing the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("writing the CNI config: {0}")]
    CniConfig(String),
}

/// Istio's `result` label values of `istio_cni_installs_total`, in exposition order.
pub const RESULTS: [&str; 4] = [
    "SUCCESS",
    "COPY_BINARIES_FAILURE",
    "CREATE_KUBECONFIG_FAILURE",
    "CREATE_CNI_CONFIG_FAILURE",
];

/// `istio_cni_installs_total{result}`: successful passes and each kind of failure.
pub fn install_counters() -> Counters {
    Counters::by(
        "istio_cni_installs_total",
        "Total number of CNI plugins installed by the Istio CNI installer",
        &["result"],
        &RESULTS,
    )
}

impl InstallError {
    pub fn result_label(&self) -> &'static str {
        match self {
            InstallError::CopyBinaries(_) => "COPY_BINARIES_FAILURE",
            InstallError::Kubeconfig(_) => "CREATE_KUBECONFIG_FAILURE",
            InstallError::CniConfig(_) => "CREATE_CNI_CONFIG_FAILURE",
        }
    }
}

#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Installed and valid. `changes` lists what this pass had to (re)write.
    Installed {
        changes: Vec<String>,
        warning: Option<String>,
    },
    /// Binaries and kubeconfig are in place, but there is no primary CNI config to chain into.
    Waiting { reason: String },
}

/// What cleanup needs to restore a file we inserted our entry into byte for byte, as long as
/// nobody touched it after our last write. Kept for EVERY file we wrote into during the
/// daemon's life (the primary can change: a corrupt primary makes us chain into the next
/// valid file), keyed by the path the entry ended up in.
#[derive(Clone, Debug)]
struct Undo {
    written_bytes: Vec<u8>,
    /// The primary's own file before we added our entry (path, bytes, mode). `None` when it
    /// already had an istio-cni entry (left by an earlier daemon): semantic removal then.
    original: Option<(PathBuf, Vec<u8>, u32)>,
    /// A file our `.conf` → `.conflist` conversion renamed over (bytes, mode): put back on
    /// uninstall with the `.conf`.
    replaced: Option<(Vec<u8>, u32)>,
}

pub struct Installer {
    cfg: Settings,
    entry: Value,
    /// dst path → (dst stamp, src stamp) after our last verified copy.
    bins: HashMap<PathBuf, (Stamp, Stamp)>,
    /// Every CNI config file (net-dir path) we inserted our entry into.
    touched: std::collections::BTreeMap<PathBuf, Undo>,
    /// Plugin types of the primary config seen last (culprit hints).
    pub primary_types: Vec<String>,
    /// Names of files in the net dir seen last (culprit hints).
    pub conf_dir_names: Vec<String>,
    /// The bytes of config names that are not UTF-8, by the lossy name the logic uses (the
    /// runtime loads such a file like any other: its path must be the real one).
    raw_names: HashMap<String, OsString>,
    /// `istio_cni_installs_total` (registered with the daemon's status by the caller).
    pub metrics: Arc<Counters>,
}

/// EROFS on Linux.
const EROFS: i32 = 30;

/// Istio users hit read-only host paths on GKE/COS; say what to do instead of just "EROFS".
fn err_hint(e: &io::Error) -> &'static str {
    if e.raw_os_error() == Some(EROFS) {
        " (read-only file system: on GKE/COS-like nodes set the chart's cniBinDir/global.platform)"
    } else {
        ""
    }
}

impl Installer {
    pub fn new(cfg: Settings, entry: Value) -> Installer {
        if cfg.owned_conf && !cfg.chained {
            tracing::warn!(
                "ISTIO_OWNED_CNI_CONFIG applies to chained mode only (as in Istio): CHAINED_CNI_PLUGIN=false writes its standalone file"
            );
        } else if cfg.owned_conf {
            tracing::info!(file = %cfg.owned_conf_name, "ISTIO_OWNED_CNI_CONFIG: the primary's config with istio-cni is kept in a file of our own; the primary's file is not written");
        }
        Installer {
            cfg,
            entry,
            bins: HashMap::new(),
            touched: Default::default(),
            primary_types: Vec::new(),
            conf_dir_names: Vec::new(),
            raw_names: HashMap::new(),
            metrics: Arc::new(install_counters()),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.cfg
    }

    pub fn entry(&self) -> &Value {
        &self.entry
    }

    pub fn pass(&mut self) -> Result<Outcome, InstallError> {
        let mut changes = Vec::new();
        self.copy_binaries(&mut changes)?;
        self.write_kubeconfig(&mut changes)?;
        self.install_conf(changes)
    }

    fn copy_binaries(&mut self, changes: &mut Vec<String>) -> Result<(), InstallError> {
        let e = |what: String| InstallError::CopyBinaries(what);
        for dir in &self.cfg.bin_target_dirs {
            node_fs::ensure_dir(dir, node_fs::DIR_MODE, false)
                .map_err(|x| e(format!("{}: {x}{}", dir.display(), err_hint(&x))))?;
            for name in &self.cfg.binaries {
                let src = self.cfg.bin_source_dir.join(name);
                let dst = dir.join(name);
                let src_stamp = node_fs::stamp(&src)
                    .map_err(|x| e(format!("source {}: {x}", src.display())))?;
                // The link itself, not its target: a planted link is never "our copy".
                let dst_stamp = node_fs::lstamp(&dst).ok();
                // Unchanged since our last verified copy (same inode, size, mtime on both sides).
                if let (Some(d), Some((rd, rs))) = (dst_stamp, self.bins.get(&dst))
                    && d == *rd
                    && src_stamp == *rs
                {
                    continue;
                }
                let identical = dst_stamp.is_some()
                    && node_fs::regular_mode(&dst) == Some(0o755)
                    && node_fs::same_contents(&src, &dst).unwrap_or(false);
                if !identical {
                    node_fs::remove_stale_temps(dir, name)
                        .map_err(|x| e(format!("{}: {x}{}", dir.display(), err_hint(&x))))?;
                    node_fs::atomic_copy(&src, &dst, 0o755).map_err(|x| {
                        e(format!(
                            "{} → {}: {x}{}",
                            src.display(),
                            dst.display(),
                            err_hint(&x)
                        ))
                    })?;
                    changes.push(format!("copied {name} to {}", dir.display()));
                }
                let d = node_fs::lstamp(&dst).map_err(|x| e(format!("{}: {x}", dst.display())))?;
                self.bins.insert(dst, (d, src_stamp));
            }
        }
        Ok(())
    }

    /// The kubeconfig text for the current token/CA.
    pub fn render_kubeconfig(&self) -> Result<String, InstallError> {
        let e = InstallError::Kubeconfig;
        let token_path = self.cfg.api.token_file();
        let token = fs::read_to_string(&token_path).map_err(|x| {
            e(format!(
                "reading the service-account token {}: {x}",
                token_path.display()
            ))
        })?;
        let trust = if self.cfg.api.skip_tls_verify {
            Trust::SkipVerify
        } else {
            Trust::Ca(fs::read(&self.cfg.api.ca_file).map_err(|x| {
                e(format!(
                    "reading the CA {}: {x}",
                    self.cfg.api.ca_file.display()
                ))
            })?)
        };
        let kc = kubeconfig::build(
            &self.cfg.api.protocol,
            &self.cfg.api.host,
            self.cfg.api.port,
            &token,
            &trust,
        )
        .map_err(|x| e(x.to_string()))?;
        let yaml = kubeconfig::to_yaml(&kc).map_err(|x| e(x.to_string()))?;
        tracing::debug!(kubeconfig = %kubeconfig::describe(&kc), "rendered kubeconfig");
        Ok(format!(
            "# Kubeconfig for the istio-cni plugin; written by install-cni.\n{yaml}"
        ))
    }

    fn write_kubeconfig(&mut self, changes: &mut Vec<String>) -> Result<(), InstallError> {
        let text = self.render_kubeconfig()?;
        let path = self.cfg.kubeconfig_path();
        // Our run dir: created 0755 whatever the umask; a planted symlink there is refused.
        node_fs::ensure_dir(&self.cfg.run_dir, node_fs::DIR_MODE, true).map_err(|x| {
            InstallError::Kubeconfig(format!("run dir (CNI_AGENT_RUN_DIR): {x}{}", err_hint(&x)))
        })?;
        // A symlink at the kubeconfig's path reads as absent: the rename replaces the link.
        let current = node_fs::read_regular(&path);
        if current.as_deref() == Some(text.as_bytes())
            && node_fs::regular_mode(&path) == Some(self.cfg.kubeconfig_mode)
        {
            return Ok(());
        }
        let e = |x: io::Error| {
            InstallError::Kubeconfig(format!("{}: {x}{}", path.display(), err_hint(&x)))
        };
        node_fs::atomic_write_mode(&path, text.as_bytes(), self.cfg.kubeconfig_mode).map_err(e)?;
        changes.push(format!(
            "{} {} (mode {:04o})",
            if current.is_some() {
                "rewrote"
            } else {
                "wrote"
            },
            path.display(),
            self.cfg.kubeconfig_mode
        ));
        Ok(())
    }

    /// `.conf`/`.conflist` files of the net dir with their stamps (a file that vanishes while
    /// we read is simply not there).
    fn snapshot(&mut self) -> Result<(Vec<ConfFile>, HashMap<String, Stamp>), InstallError> {
        let dir = &self.cfg.net_dir;
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(x) if x.kind() == io::ErrorKind::NotFound => {
                return Ok((Vec::new(), HashMap::new()));
            }
            Err(x) => return Err(InstallError::CniConfig(format!("{}: {x}", dir.display()))),
        };
        let mut files = Vec::new();
        let mut stamps = HashMap::new();
        let mut names = Vec::new();
        self.raw_names.clear();
        for ent in rd.flatten() {
            let raw = ent.file_name();
            let name = raw.to_string_lossy().into_owned();
            names.push(name.clone());
            if discovery::format_of(&name).is_none() {
                continue;
            }
            if raw.to_str().is_none() && self.raw_names.insert(name.clone(), raw).is_some() {
                tracing::warn!(
                    "two CNI config names read the same once decoded ({name}); using one"
                );
                continue;
            }
            let p = ent.path();
            let Ok(st) = node_fs::stamp(&p) else { continue };
            let content = match node_fs::read_conf(&p, node_fs::MAX_CONF_BYTES) {
                Ok(c) => c,
                // Gone since the listing: simply not there.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                // A FIFO or a device is never waited on, a file over the bound never read.
                Err(e) => {
                    tracing::warn!("skipping the CNI config {}: {e}", p.display());
                    continue;
                }
            };
            stamps.insert(name.clone(), st);
            files.push(ConfFile { name, content });
        }
        names.sort();
        self.conf_dir_names = names;
        Ok((files, stamps))
    }

    fn install_conf(&mut self, mut changes: Vec<String>) -> Result<Outcome, InstallError> {
        if self.cfg.chained && !self.cfg.owned_conf {
            self.retire_owned(&mut changes);
        }
        // The primary may rewrite its file between our read and our rename; then our write
        // would resurrect its old content. Re-check the file's identity right before the
        // rename and start over if it moved (bounded: a storm is the throttle's job).
        for _ in 0..5 {
            if let Some(out) = self.try_install_conf(&changes)? {
                return Ok(out);
            }
        }
        Err(InstallError::CniConfig(
            "the CNI config kept changing under us (5 attempts); will retry".into(),
        ))
    }

    fn try_install_conf(&mut self, changes: &[String]) -> Result<Option<Outcome>, InstallError> {
        let (files, stamps) = self.snapshot()?;
        let plan = match self.plan_conf(&files) {
            Ok(owned) => return self.install_owned(owned, &files, &stamps, changes),
            Err(plan) => plan,
        };
        let mut changes = changes.to_vec();
        match plan {
            ConfPlan::Wait { reason } => {
                self.primary_types.clear();
                Ok(Some(Outcome::Waiting { reason }))
            }
            ConfPlan::Valid { file, warning } => {
                self.note_primary(&files, &file);
                Ok(Some(Outcome::Installed { changes, warning }))
            }
            ConfPlan::Write {
                file,
                content,
                rename_to,
                before,
            } => {
                let path = self.conf_path(&file);
                let original_bytes = files
                    .iter()
                    .find(|f| f.name == file)
                    .map(|f| f.content.clone());
                let mut bytes = serde_json::to_vec_pretty(&content)
                    .map_err(|x| InstallError::CniConfig(x.to_string()))?;
                bytes.push(b'\n');
                let e = |x: io::Error| {
                    InstallError::CniConfig(format!("{}: {x}{}", path.display(), err_hint(&x)))
                };
                if node_fs::stamp(&path).ok() != stamps.get(&file).copied() {
                    return Ok(None);
                }
                node_fs::ensure_dir(&self.cfg.net_dir, node_fs::DIR_MODE, false).map_err(e)?;
                // A symlinked config stays a link (its target in the net dir is written).
                let target = node_fs::conf_write_target(&self.cfg.net_dir, &path).map_err(e)?;
                if rename_to.is_some() && target != path {
                    return Err(InstallError::CniConfig(format!(
                        "{} is a symlink; converting it to a .conflist would replace the link; refusing (make it a .conflist or a regular file)",
                        path.display()
                    )));
                }
                let mode = node_fs::existing_mode(&target).unwrap_or(self.cfg.conf_mode);
                node_fs::atomic_write_mode(&target, &bytes, mode).map_err(e)?;
                let mut replaced = None;
                let final_path = match &rename_to {
                    Some(to) => {
                        let to = self.conf_path(to);
                        // A list carrying our entry is an earlier conversion of ours (the
                        // primary wrote its .conf again): what that one replaced stays owed.
                        let over = node_fs::read_conf(&to, node_fs::MAX_CONF_BYTES).ok();
                        replaced = match over {
                            Some(b) if gojson::parse(&b).is_ok_and(|v| names_ours(&v)) => {
                                self.touched.get(&to).and_then(|u| u.replaced.clone())
                            }
                            Some(b) => Some((b, node_fs::existing_mode(&to).unwrap_or(mode))),
                            None => None,
                        };
                        fs::rename(&path, &to).map_err(e)?;
                        to
                    }
                    None => path.clone(),
                };
                if self.cfg.chained {
                    let had_ours = before.as_ref().is_some_and(names_ours);
                    self.touched.insert(
                        final_path.clone(),
                        Undo {
                            written_bytes: bytes,
                            original: match (had_ours, original_bytes) {
                                (false, Some(b)) => Some((path.clone(), b, mode)),
                                _ => None,
                            },
                            replaced,
                        },
                    );
                }
                let what = match (&before, self.cfg.chained) {
                    (_, false) => format!("wrote standalone {}", final_path.display()),
                    (Some(b), true) => format!(
                        "chained istio-cni into {} (plugins before: [{}])",
                        final_path.display(),
                        discovery::plugin_types(b).join(", ")
                    ),
                    (None, true) => format!("chained istio-cni into {}", final_path.display()),
                };
                changes.push(what);
                let final_name = final_path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                self.primary_types = discovery::plugin_types(&content);
                if !self.conf_dir_names.contains(&final_name) {
                    self.conf_dir_names.push(final_name);
                }
                Ok(Some(Outcome::Installed {
                    changes,
                    warning: None,
                }))
            }
        }
    }

    /// What this pass does with the CNI config: `Ok` for the owned file (`ISTIO_OWNED_CNI_CONFIG`),
    /// `Err` for the primary's file (chained) or the standalone file.
    fn plan_conf(&self, files: &[ConfFile]) -> Result<ConfPlan, ConfPlan> {
        let conf_name = self.cfg.cni_conf_name.as_deref();
        if !self.cfg.chained {
            let name = self.standalone_conf_name();
            return Err(discovery::plan_standalone(files, &name, &self.entry));
        }
        if !self.cfg.uses_owned_conf() {
            return Err(discovery::plan_chained(files, conf_name, &self.entry));
        }
        let owned_name = &self.cfg.owned_conf_name;
        match owned::plan(files, conf_name, owned_name, &self.entry) {
            OwnedPlan::Conf(plan) => Ok(plan),
            OwnedPlan::Fallback { first } => {
                let note = format!(
                    "{first} sorts before ISTIO_OWNED_CNI_CONFIG_FILENAME {owned_name}: the runtime would never read our file; istio-cni is chained into the primary's file instead (name ours to sort first, e.g. 00-istio-cni.conflist)"
                );
                Err(
                    match discovery::plan_chained(files, conf_name, &self.entry) {
                        ConfPlan::Valid { file, warning } => ConfPlan::Valid {
                            file,
                            warning: Some(warning.map_or(note.clone(), |w| format!("{note}; {w}"))),
                        },
                        other => other,
                    },
                )
            }
        }
    }

    /// The owned file (`ISTIO_OWNED_CNI_CONFIG`): the primary's config with our entry, in a
    /// regular file of our own with `CNI_CONF_GROUP_READ`'s mode; the primary's file is never
    /// written. `None`: the primary or our file changed since the snapshot (start over).
    fn install_owned(
        &mut self,
        plan: ConfPlan,
        files: &[ConfFile],
        stamps: &HashMap<String, Stamp>,
        changes: &[String],
    ) -> Result<Option<Outcome>, InstallError> {
        let mut changes = changes.to_vec();
        let name = self.cfg.owned_conf_name.clone();
        let path = self.cfg.net_dir.join(&name);
        let source = owned::source_name(files, self.cfg.cni_conf_name.as_deref(), &name);
        let (content, before) = match plan {
            ConfPlan::Wait { reason } => {
                self.primary_types.clear();
                return Ok(Some(Outcome::Waiting { reason }));
            }
            ConfPlan::Valid { .. } if node_fs::regular_mode(&path) == Some(self.cfg.conf_mode) => {
                if let Some(s) = &source {
                    self.note_primary(files, s);
                }
                return Ok(Some(Outcome::Installed {
                    changes,
                    warning: None,
                }));
            }
            // The right content behind a link or with another mode: ours again, as a file.
            ConfPlan::Valid { .. } => {
                let current = files.iter().find(|f| f.name == name);
                match current.and_then(|f| gojson::parse(&f.content).ok()) {
                    Some(v) => (v, None),
                    None => return Ok(None),
                }
            }
            ConfPlan::Write {
                content, before, ..
            } => (content, before),
        };
        // Written from the snapshot's primary: if it moved since, the copy would be stale.
        for n in source.iter().chain(std::iter::once(&name)) {
            if node_fs::stamp(&self.conf_path(n)).ok() != stamps.get(n).copied() {
                return Ok(None);
            }
        }
        let mut bytes = serde_json::to_vec_pretty(&content)
            .map_err(|x| InstallError::CniConfig(x.to_string()))?;
        bytes.push(b'\n');
        let e = |x: io::Error| {
            InstallError::CniConfig(format!("{}: {x}{}", path.display(), err_hint(&x)))
        };
        node_fs::ensure_dir(&self.cfg.net_dir, node_fs::DIR_MODE, false).map_err(e)?;
        // A link planted at our name is replaced by the rename, never written through.
        node_fs::atomic_write_mode(&path, &bytes, self.cfg.conf_mode).map_err(e)?;
        changes.push(format!(
            "wrote {} (mode {:04o}): {} with istio-cni (plugins before: [{}])",
            path.display(),
            self.cfg.conf_mode,
            source.as_deref().unwrap_or("the primary"),
            before
                .as_ref()
                .map(discovery::plugin_types)
                .unwrap_or_default()
                .join(", ")
        ));
        self.primary_types = discovery::plugin_types(&content);
        if !self.conf_dir_names.contains(&name) {
            self.conf_dir_names.push(name);
        }
        Ok(Some(Outcome::Installed {
            changes,
            warning: None,
        }))
    }

    /// With `ISTIO_OWNED_CNI_CONFIG` off, a file of ours at its name (left by a daemon that had
    /// it on) would shadow the primary with a stale copy: removed.
    fn retire_owned(&self, changes: &mut Vec<String>) {
        let name = &self.cfg.owned_conf_name;
        if self.cfg.cni_conf_name.as_deref() == Some(name.as_str()) {
            return;
        }
        let p = self.cfg.net_dir.join(name);
        let Ok(bytes) = node_fs::read_conf(&p, node_fs::MAX_CONF_BYTES) else {
            return;
        };
        if !owned::is_leftover(&bytes) {
            return;
        }
        match fs::remove_file(&p) {
            Ok(()) => changes.push(format!(
                "removed {} (ISTIO_OWNED_CNI_CONFIG is off: a copy an earlier daemon left)",
                p.display()
            )),
            Err(e) => tracing::warn!("removing {}: {e}", p.display()),
        }
    }

    /// The path of the config the last snapshot named `name` (a name that is not UTF-8 back to
    /// its bytes; so is the `.conflist` a `.conf` of such a name is converted to).
    fn conf_path(&self, name: &str) -> PathBuf {
        if let Some(raw) = self.raw_names.get(name) {
            return self.cfg.net_dir.join(raw);
        }
        if let Some(raw) = name
            .strip_suffix("list")
            .and_then(|conf| self.raw_names.get(conf))
        {
            let mut list = raw.clone();
            list.push("list");
            return self.cfg.net_dir.join(list);
        }
        self.cfg.net_dir.join(name)
    }

    /// The file a standalone (not chained) entry is written to: `CNI_CONF_NAME`, else Istio's.
    fn standalone_conf_name(&self) -> String {
        self.cfg
            .cni_conf_name
            .clone()
            .unwrap_or_else(|| STANDALONE_CONF_NAME.into())
    }

    fn note_primary(&mut self, files: &[ConfFile], name: &str) {
        self.primary_types = files
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| gojson::parse(&f.content).ok())
            .map(|v| discovery::plugin_types(&v))
            .unwrap_or_default();
    }

    /// Removes what we installed (Istio's `Cleanup`): our entry (or our standalone file), then
    /// the kubeconfig and the binaries. Returns what it did and what failed. The config goes
    /// first and, as in Istio, a failure there keeps the rest: a chain that still names
    /// istio-cni must still find its binary (without it every pod's ADD fails).
    pub fn cleanup(&mut self) -> (Vec<String>, Vec<String>) {
        let mut done = Vec::new();
        let mut errors = Vec::new();
        self.cleanup_config(&mut done, &mut errors);
        if !errors.is_empty() {
            errors.push(
                "kept the kubeconfig and the binaries: a CNI config may still name istio-cni"
                    .into(),
            );
            return (done, errors);
        }
        self.cleanup_files(&mut done, &mut errors);
        (done, errors)
    }

    /// Our entry out of every CNI config that carries it (or our standalone file removed).
    fn cleanup_config(&mut self, done: &mut Vec<String>, errors: &mut Vec<String>) {
        if self.cfg.chained {
            self.cleanup_chained(done, errors);
        } else {
            let name = self.standalone_conf_name();
            let p = self.cfg.net_dir.join(name);
            let ours = node_fs::read_conf(&p, node_fs::MAX_CONF_BYTES)
                .ok()
                .and_then(|b| gojson::parse(&b).ok())
                .is_some_and(|v| {
                    v.get("type").and_then(Value::as_str) == Some(cni_config::PLUGIN_TYPE)
                });
            if ours {
                remove(&p, done, errors);
            }
        }
    }

    /// The kubeconfig, the daemon's sockets in the run dir (pod lookup, log relay, ambient
    /// plugin events: no endpoint left behind) and the binaries, once no config names the
    /// plugin.
    fn cleanup_files(&mut self, done: &mut Vec<String>, errors: &mut Vec<String>) {
        if node_fs::is_symlink(&self.cfg.run_dir) {
            // Nothing of ours is behind it: no write ever follows such a link.
            done.push(format!(
                "left {} alone: it is a symlink we did not create",
                self.cfg.run_dir.display()
            ));
        } else {
            remove(&self.cfg.kubeconfig_path(), done, errors);
            let sockets = [
                cni_config::lookup::POD_LOOKUP_SOCKET,
                cni_config::log::LOG_SOCKET,
                cni_config::ambient::PLUGIN_EVENT_SOCKET,
                cni_config::status::STATUS_SOCKET,
            ];
            for name in sockets {
                let p = self.cfg.run_dir.join(name);
                match node_fs::remove_socket(&p) {
                    Ok(true) => done.push(format!("removed {}", p.display())),
                    Ok(false) => {}
                    Err(e) => errors.push(format!("removing {}: {e}", p.display())),
                }
            }
        }
        for dir in &self.cfg.bin_target_dirs {
            for name in &self.cfg.binaries {
                remove(&dir.join(name), done, errors);
                let _ = node_fs::remove_stale_temps(dir, name);
            }
        }
        self.bins.clear();
    }

    fn cleanup_chained(&mut self, done: &mut Vec<String>, errors: &mut Vec<String>) {
        // Our own file first: the sweep below would leave it a stale copy of the primary,
        // still sorting first.
        if self.cfg.owned_conf {
            let p = self.cfg.net_dir.join(&self.cfg.owned_conf_name);
            let ours = node_fs::read_conf(&p, node_fs::MAX_CONF_BYTES)
                .is_ok_and(|b| owned::is_leftover(&b));
            if ours {
                remove(&p, done, errors);
            }
        }
        // Every file we wrote into and nobody changed since: its bytes from before our entry
        // come back exactly (a converted .conf returns as the .conf it was).
        for (written, u) in std::mem::take(&mut self.touched) {
            self.restore(&written, &u, done, errors);
        }
        // Then our entry goes from whichever list still carries it (changed since our write,
        // or left by an earlier daemon), keeping the rest as is.
        let Ok(rd) = fs::read_dir(&self.cfg.net_dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| discovery::format_of(&e.file_name().to_string_lossy()).is_some())
            .map(|e| e.path())
            .collect();
        paths.sort();
        for p in paths {
            let Some(v) = node_fs::read_conf(&p, node_fs::MAX_CONF_BYTES)
                .ok()
                .and_then(|b| gojson::parse(&b).ok())
            else {
                continue;
            };
            let Some(clean) = discovery::remove_ours(&v) else {
                continue;
            };
            let mut bytes = serde_json::to_vec_pretty(&clean).unwrap_or_default();
            bytes.push(b'\n');
            let res = node_fs::conf_write_target(&self.cfg.net_dir, &p)
                .and_then(|t| node_fs::atomic_write(&t, &bytes, self.cfg.conf_mode));
            match res {
                Ok(()) => done.push(format!("removed istio-cni from {}", p.display())),
                Err(e) => errors.push(format!("removing istio-cni from {}: {e}", p.display())),
            }
        }
    }

    fn restore(&self, written: &Path, u: &Undo, done: &mut Vec<String>, errors: &mut Vec<String>) {
        let Some((orig_path, orig_bytes, mode)) = &u.original else {
            return;
        };
        let now = node_fs::read_conf(written, node_fs::MAX_CONF_BYTES).ok();
        if now.as_deref() != Some(&u.written_bytes[..]) {
            return;
        }
        let res = node_fs::conf_write_target(&self.cfg.net_dir, orig_path)
            .and_then(|t| node_fs::atomic_write_mode(&t, orig_bytes, *mode));
        match res {
            Ok(()) => {
                if orig_path != written {
                    match &u.replaced {
                        // The file our conversion renamed over comes back in its place.
                        Some((bytes, mode)) => {
                            match node_fs::atomic_write_mode(written, bytes, *mode) {
                                Ok(()) => done.push(format!("restored {}", written.display())),
                                Err(e) => {
                                    errors.push(format!("restoring {}: {e}", written.display()))
                                }
                            }
                        }
                        None => remove(written, done, errors),
                    }
                }
                done.push(format!("restored {}", orig_path.display()));
            }
            Err(e) => errors.push(format!("restoring {}: {e}", orig_path.display())),
        }
    }
}

/// Whether a CNI config lists istio-cni.
fn names_ours(v: &Value) -> bool {
    discovery::plugin_types(v)
        .iter()
        .any(|t| t == cni_config::PLUGIN_TYPE)
}

fn remove(p: &Path, done: &mut Vec<String>, errors: &mut Vec<String>) {
    match fs::remove_file(p) {
        Ok(()) => done.push(format!("removed {}", p.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => errors.push(format!("removing {}: {e}", p.display())),
    }
}
