//! Readiness is signalled to systemd (`Type=notify`): READY=1 once a leader is known,
//! STOPPING=1 on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn readiness_and_stopping_reach_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_docket-controller"))
        .args([
            "run",
            "--id",
            "1",
            "--listen",
            &addr,
            "--agent-fence-ms",
            "0",
        ])
        .args(["--log", "off", "--bootstrap", &format!("1={addr}")])
        .args(common::secret_flags(1))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let read = |buf: &mut [u8]| -> String {
        let n = socket.recv(buf).expect("no notification within 30 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = read(&mut buf);
    assert!(ready.contains("READY=1"), "{ready:?}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let stopping = read(&mut buf);
    assert!(stopping.contains("STOPPING=1"), "{stopping:?}");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("did not exit on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
