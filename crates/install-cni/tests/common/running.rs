//! Running pods for the tests that find a pod's namespace through /proc (repair, reconcile):
//! a real network namespace with a process in it, and a proc root whose `1` is this process.
#![allow(dead_code)]

use super::Env;
use super::kube_api::broken_pod;
use capture::Plan;
use guardian::podplan;
use k8s_openapi::api::core::v1::Pod;
use pod_policy::Decision;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use testbed::{ConnectSpec, PodWorld, connect};

/// A pod namespace with a process in it (its /proc/PID/ns/net is how the daemon finds it) and
/// an address unique to this test process, so namespaces of concurrently running tests that
/// reuse PodWorld's subnets can never match.
pub struct RunningPod {
    pub world: PodWorld,
    pub ip: IpAddr,
    sleeper: Child,
}

impl RunningPod {
    pub fn new() -> RunningPod {
        static N: AtomicU32 = AtomicU32::new(1);
        let world = PodWorld::ipv4_only().unwrap();
        let n = N.fetch_add(1, Ordering::SeqCst);
        let ip: IpAddr = format!("172.31.{}.{}", std::process::id() % 250, n)
            .parse()
            .unwrap();
        world
            .pod
            .ip_batch(&[format!("addr add {ip}/32 dev eth0")])
            .unwrap();
        let sleeper = world
            .pod
            .run(|| {
                Command::new("sleep")
                    .arg("infinity")
                    .stdin(Stdio::null())
                    .spawn()
            })
            .unwrap()
            .unwrap();
        RunningPod { world, ip, sleeper }
    }

    /// Puts `ip` on the pod's interface too (an address reused, or handed out twice).
    pub fn add_ip(&self, ip: IpAddr) {
        self.world
            .pod
            .ip_batch(&[format!("addr add {ip}/32 dev eth0")])
            .unwrap();
    }

    /// The PID of the process in the pod's namespace (its `/proc/PID/ns/net`).
    pub fn pid(&self) -> u32 {
        self.sleeper.id()
    }

    /// Where a connection from the pod to the world's port 80 lands.
    pub fn outbound(&self) -> Option<u16> {
        connect(
            self.world.pod.path(),
            &ConnectSpec::new(self.world.world_v4.into(), 80).timeout(Duration::from_secs(2)),
        )
        .landed_port()
    }

    pub fn inbound(&self) -> Option<u16> {
        connect(
            self.world.world.path(),
            &ConnectSpec::new(self.world.pod_v4.into(), 8080).timeout(Duration::from_secs(2)),
        )
        .landed_port()
    }
}

impl Drop for RunningPod {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
    }
}

/// A proc root for the daemon: every process of /proc, except that `1` is this test process.
/// The real PID 1 of a sandbox may be unreadable (non-dumpable supervisor), while the daemon
/// needs `<proc>/1/ns/net` as the host namespace reference; this test process lives there.
/// Processes started after this call are not in it.
pub fn proc_root(env: &Env) -> PathBuf {
    let root = env.tmp.path().join("host-proc");
    std::fs::create_dir_all(&root).unwrap();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_ok() && name != "1" {
            let _ = std::os::unix::fs::symlink(e.path(), root.join(&name));
        }
    }
    std::os::unix::fs::symlink(format!("/proc/{}", std::process::id()), root.join("1")).unwrap();
    root
}

/// A running sidecar pod on `node` whose istio-validation init container succeeded.
pub fn mesh_pod(node: &str, name: &str, uid: &str, ip: &str) -> Value {
    let mut p = broken_pod("shop", name, uid, ip, node, 126);
    p["status"]["phase"] = json!("Running");
    p["status"]["initContainerStatuses"][0]["state"] =
        json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    p["status"]["initContainerStatuses"][0]["lastState"] = json!({});
    p
}

/// A pod on `node` outside the mesh (no sidecar).
pub fn plain_pod(node: &str, name: &str, uid: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    })
}

/// The plan the plugin programs for `pod` in `running`'s namespace (the daemon's own code).
pub fn plan_for(pod: &Value, running: &RunningPod) -> Plan {
    let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
    let Decision::Sidecar(pc) = podplan::verdict(&pod, &super::sidecar_policy()).unwrap() else {
        panic!("not a mesh pod")
    };
    podplan::plan_in(&pc.config, running.world.pod.path())
        .unwrap()
        .0
}

/// `nft ARGS` in the pod's namespace; its output.
pub fn nft(p: &RunningPod, args: &str) -> String {
    let args: Vec<&str> = args.split_whitespace().collect();
    p.world.pod.exec_ok("nft", &args).unwrap()
}
