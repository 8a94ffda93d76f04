//! `--run-validation`: istio-iptables' probe (tools/istio-iptables/pkg/validation). As the
//! proxy user, listen on `127.0.0.1:<inbound capture port>` and dial `127.0.0.6:<probe port>`;
//! only the "proxy to own pod over lo → inbound" rule makes that connection land on the
//! listener, so success proves the redirect is in place.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Probe {
    pub listen_port: u16,
    pub probe_port: u16,
    pub timeout: Duration,
}

pub fn run(p: &Probe) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", p.listen_port))
        .map_err(|e| format!("listening on 127.0.0.1:{}: {e}", p.listen_port))?;
    let token = format!("istio-validation-{}", std::process::id());
    let accept = {
        let token = token.clone();
        std::thread::spawn(move || -> Result<(), String> {
            let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
            let mut got = vec![0u8; token.len()];
            s.read_exact(&mut got).map_err(|e| e.to_string())?;
            (got == token.as_bytes())
                .then_some(())
                .ok_or_else(|| "unexpected payload".to_string())
        })
    };
    let deadline = Instant::now() + p.timeout;
    let target: SocketAddr = ([127, 0, 0, 6], p.probe_port).into();
    loop {
        match TcpStream::connect_timeout(&target, Duration::from_millis(500)) {
            Ok(mut s) => {
                s.write_all(token.as_bytes()).map_err(|e| e.to_string())?;
                break;
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "connecting to {target}: {e} (the redirect is not in place)"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    accept
        .join()
        .map_err(|_| "listener thread panicked".to_string())?
}
