//! Mutual TLS as the daemons use it, over real loopback connections: the server asks for a
//! client certificate of the cluster CA but takes anonymous clients too (users' commands);
//! clients accept only a controller replica's certificate (srun: only the certificate of the
//! node it reaches); certificates of another CA are
//! refused in the handshake; and a server's certificate changes without a restart when its
//! files do (or on SIGHUP).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use docket_auth::local::LocalSecrets;
use docket_auth::tls::{Role, TlsContext};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

/// A server accepting on a fresh port with `tls`, echoing one byte per connection.
async fn echo_server(tls: TlsContext) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut incoming = docket_auth::tls::serve::incoming(listener, tls);
    tokio::spawn(async move {
        while let Some(Ok(stream)) = incoming.next().await {
            tokio::spawn(echo_one_byte(stream));
        }
    });
    addr
}

/// What the test servers do with a connection: echo one byte.
async fn echo_one_byte(mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin) {
    let mut b = [0u8; 1];
    if stream.read_exact(&mut b).await.is_ok() {
        let _ = stream.write_all(&b).await;
    }
}

/// A connection to `addr` with `config` that has sent one byte and read it back, or why not.
/// TLS 1.3 reports a refused client certificate only on the first read, and a server's
/// session tickets, sent after the handshake, have been read by then.
async fn echoed(
    addr: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(b"x").await.map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    stream.read_exact(&mut b).await.map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Connects to `addr` as `client`; the server's leaf certificate, or the handshake's error.
async fn connect(
    addr: &str,
    client: &TlsContext,
) -> Result<rustls_pki_types::CertificateDer<'static>, String> {
    connect_with(addr, client.client_config()).await
}

/// [`connect`] with a client configuration of its own.
async fn connect_with(
    addr: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> Result<rustls_pki_types::CertificateDer<'static>, String> {
    let stream = echoed(addr, config).await?;
    let (_, session) = stream.get_ref();
    Ok(session.peer_certificates().unwrap()[0].clone())
}

fn secrets(dir: &std::path::Path, name: &str) -> LocalSecrets {
    LocalSecrets::create(&dir.join(name), name).unwrap()
}

#[tokio::test]
async fn roles_and_cas_are_checked_in_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let theirs = secrets(dir.path(), "theirs");
    let localhost = ["127.0.0.1".to_owned()];
    let replica = TlsContext::load(ours.issue(&Role::Replica(1), &localhost).unwrap()).unwrap();
    let addr = echo_server(replica).await;

    // An anonymous client (the command line) and a node of this cluster are served.
    let anonymous = TlsContext::load(ours.anonymous()).unwrap();
    connect(&addr, &anonymous).await.unwrap();
    let node = TlsContext::load(ours.issue(&Role::Node("n01".into()), &[]).unwrap()).unwrap();
    connect(&addr, &node).await.unwrap();
    // A client certificate of another cluster's CA is refused.
    let stranger = TlsContext::load(theirs.issue(&Role::Replica(1), &localhost).unwrap()).unwrap();
    let e = connect(&addr, &stranger).await.unwrap_err();
    assert!(!e.is_empty());
    // A client of another cluster refuses our server (unknown issuer).
    let e = connect(&addr, &TlsContext::load(theirs.anonymous()).unwrap())
        .await
        .unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("unknown issuer"),
        "{e}"
    );

    // A server holding a node's certificate (agents serve srun's step port with it) is no
    // controller: the role in the certificate is checked, not only the CA.
    let node_served = ours.issue(&Role::Node("n98".into()), &localhost).unwrap();
    let addr2 = echo_server(TlsContext::load(node_served).unwrap()).await;
    let e = connect(&addr2, &anonymous).await.unwrap_err();
    assert!(e.contains("for node n98, not a controller replica"), "{e}");
    // srun reaching node n98's agent takes that certificate and no other: not n97's, and
    // not a replica's.
    let to = |node: &str| anonymous.node_client_config(node).unwrap();
    connect_with(&addr2, to("n98")).await.unwrap();
    let e = connect_with(&addr2, to("n97")).await.unwrap_err();
    assert!(e.contains("not node n97's agent"), "{e}");
    let e = connect_with(&addr, to("n98")).await.unwrap_err();
    assert!(e.contains("not node n98's agent"), "{e}");
}

/// The suite the daemons and commands agree on, and that a peer offering only AES-256 is
/// still served.
#[tokio::test]
async fn connections_take_aes_128_first_and_still_serve_aes_256() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let replica = TlsContext::load(ours.issue(&Role::Replica(1), &localhost).unwrap()).unwrap();
    let addr = echo_server(replica).await;
    let anonymous = TlsContext::load(ours.anonymous()).unwrap();
    let suite = |config: std::sync::Arc<rustls::ClientConfig>| {
        let addr = addr.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .unwrap();
            stream.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            stream.read_exact(&mut b).await.unwrap();
            stream
                .get_ref()
                .1
                .negotiated_cipher_suite()
                .unwrap()
                .suite()
        }
    };
    assert_eq!(
        suite(anonymous.client_config()).await,
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
    );
    // A client that offers AES-256 first and only it, trusting the cluster's CA.
    let mut only_256 = rustls::crypto::ring::default_provider();
    only_256
        .cipher_suites
        .retain(|s| s.suite() == rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
    let mut roots = rustls::RootCertStore::empty();
    for ca in rustls_pki_types::CertificateDer::pem_file_iter(&anonymous.files().ca).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(only_256))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    assert_eq!(
        suite(std::sync::Arc::new(config)).await,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
    );
}

#[tokio::test]
async fn a_servers_certificate_changes_with_its_files_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let files = ours.issue(&Role::Replica(1), &localhost).unwrap();
    let server = TlsContext::load(files.clone()).unwrap();
    let watch = server.watch(Duration::from_millis(100));
    let addr = echo_server(server.clone()).await;
    let client = TlsContext::load(ours.anonymous()).unwrap();
    let first = connect(&addr, &client).await.unwrap();

    // A new certificate for the same replica replaces the files (as an operator's renewal
    // would): new connections get it within the watch period, no restart.
    let renewed = tempfile::tempdir().unwrap();
    let (cert, key) = files.identity.clone().unwrap();
    docket_auth::tls::pki::CertAuthority::load(ours.dir())
        .unwrap()
        .issue(&Role::Replica(1), &localhost, 30)
        .unwrap()
        .save(renewed.path(), "r")
        .unwrap();
    std::fs::copy(renewed.path().join("r.key"), &key).unwrap();
    std::fs::copy(renewed.path().join("r.pem"), &cert).unwrap();
    let start = Instant::now();
    loop {
        let now = connect(&addr, &client).await.unwrap();
        if now != first {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the server still presents the old certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A bad replacement is refused and the certificate in force stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    assert!(server.reload().is_err());
    connect(&addr, &client).await.unwrap();
    watch.abort();
}

#[tokio::test]
async fn a_certificate_of_another_identity_is_refused_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let files = ours.issue(&Role::Replica(1), &localhost).unwrap();
    let server = TlsContext::load(files.clone()).unwrap();
    let addr = echo_server(server.clone()).await;
    let client = TlsContext::load(ours.anonymous()).unwrap();
    let first = connect(&addr, &client).await.unwrap();
    let (cert, key) = files.identity.clone().unwrap();
    // Replica 2's certificate, then a node's, dropped into replica 1's files: both
    // refused, naming both identities; replica 1 keeps presenting its own.
    for other in [Role::Replica(2), Role::Node("n01".into())] {
        let elsewhere = tempfile::tempdir().unwrap();
        docket_auth::tls::pki::CertAuthority::load(ours.dir())
            .unwrap()
            .issue(&other, &localhost, 30)
            .unwrap()
            .save(elsewhere.path(), "x")
            .unwrap();
        std::fs::copy(elsewhere.path().join("x.key"), &key).unwrap();
        std::fs::copy(elsewhere.path().join("x.pem"), &cert).unwrap();
        let e = server.reload().unwrap_err().to_string();
        assert!(e.contains(&other.to_string()), "{e}");
        assert!(e.contains(&Role::Replica(1).to_string()), "{e}");
        assert_eq!(server.role(), Some(Role::Replica(1)));
        assert_eq!(connect(&addr, &client).await.unwrap(), first);
    }
}

#[tokio::test]
async fn sighup_reloads_a_servers_certificate_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let files = ours.issue(&Role::Replica(2), &localhost).unwrap();
    let server = TlsContext::load(files.clone()).unwrap();
    // File changes are looked for only hourly here: the signal alone must do it.
    let watch = server.watch(Duration::from_secs(3600));
    let addr = echo_server(server.clone()).await;
    let client = TlsContext::load(ours.anonymous()).unwrap();
    let first = connect(&addr, &client).await.unwrap();
    let renewed = tempfile::tempdir().unwrap();
    docket_auth::tls::pki::CertAuthority::load(ours.dir())
        .unwrap()
        .issue(&Role::Replica(2), &localhost, 30)
        .unwrap()
        .save(renewed.path(), "r")
        .unwrap();
    let (cert, key) = files.identity.clone().unwrap();
    std::fs::copy(renewed.path().join("r.key"), &key).unwrap();
    std::fs::copy(renewed.path().join("r.pem"), &cert).unwrap();
    // Let the watcher's first (immediate) tick pass, then signal.
    tokio::time::sleep(Duration::from_millis(50)).await;
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    let start = Instant::now();
    while connect(&addr, &client).await.unwrap() == first {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "SIGHUP did not reload the certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
}

/// The handshake kind of one connection to `addr` with `config` ([`echoed`]).
async fn handshake_kind(
    addr: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> rustls::HandshakeKind {
    let stream = echoed(addr, config).await.unwrap();
    stream.get_ref().1.handshake_kind().unwrap()
}

/// A server of `config` on a fresh port, echoing one byte per connection: a rustls
/// configuration of the test's own, not the daemons'.
async fn echo_server_with(config: std::sync::Arc<rustls::ServerConfig>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(stream) = acceptor.accept(tcp).await {
                    echo_one_byte(stream).await;
                }
            });
        }
    });
    addr
}

/// No session is resumed: a server sends no tickets and keeps no sessions, so even a client
/// that would resume makes a full handshake, verified by the configuration in force; and the
/// daemons' and commands' clients never try, even with a server that offers tickets.
#[tokio::test]
async fn every_connection_makes_a_full_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let replica = TlsContext::load(ours.issue(&Role::Replica(1), &localhost).unwrap()).unwrap();
    let server = replica.server_config().unwrap();
    let addr = echo_server(replica).await;
    let anonymous = TlsContext::load(ours.anonymous()).unwrap();
    let node = TlsContext::load(ours.issue(&Role::Node("n01".into()), &[]).unwrap()).unwrap();

    // A client that would resume, with rustls' default cache.
    let mut resuming = (*anonymous.client_config()).clone();
    resuming.resumption = rustls::client::Resumption::default();
    let resuming = std::sync::Arc::new(resuming);

    // rustls' defaults resume: a server sending tickets, and the client above.
    let mut offering = (*server).clone();
    offering.send_tls13_tickets = 2;
    offering.session_storage = rustls::server::ServerSessionMemoryCache::new(64);
    let offering = echo_server_with(std::sync::Arc::new(offering)).await;
    assert_eq!(
        handshake_kind(&offering, resuming.clone()).await,
        rustls::HandshakeKind::Full
    );
    assert_eq!(
        handshake_kind(&offering, resuming.clone()).await,
        rustls::HandshakeKind::Resumed,
        "the check must see a resumption where there is one"
    );

    // Our server offers nothing to resume.
    for _ in 0..3 {
        let kind = handshake_kind(&addr, resuming.clone()).await;
        assert_eq!(kind, rustls::HandshakeKind::Full);
    }
    // Our clients, anonymous and a node's, resume nothing, even where it is offered.
    for config in [anonymous.client_config(), node.client_config()] {
        for at in [&addr, &offering, &offering] {
            assert_eq!(
                handshake_kind(at, config.clone()).await,
                rustls::HandshakeKind::Full
            );
        }
    }
}

/// A replica dials a peer by its id: a server at that address holding another replica's
/// certificate is refused before anything is sent (one replica answering for another would
/// be counted twice in a quorum), while a connection that accepts any replica (the command
/// line, a status probe) takes it.
#[tokio::test]
async fn a_replica_dialled_by_id_must_be_that_replica() {
    use docket_auth::tls::connect::Connector;
    use tower::Service;

    let dir = tempfile::tempdir().unwrap();
    let ours = secrets(dir.path(), "ours");
    let localhost = ["127.0.0.1".to_owned()];
    let replica = |id| TlsContext::load(ours.issue(&Role::Replica(id), &localhost).unwrap());
    let at_2 = echo_server(replica(2).unwrap()).await;
    let node = ours.issue(&Role::Node("n01".into()), &localhost).unwrap();
    let node_served = echo_server(TlsContext::load(node).unwrap()).await;
    let dialler = replica(1).unwrap();
    let dial = |mut connector: Connector, addr: &str| {
        let uri: http::Uri = format!("http://{addr}").parse().unwrap();
        async move {
            connector
                .call(uri)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };

    dial(Connector::to_replica(dialler.clone(), 2), &at_2)
        .await
        .unwrap();
    let e = dial(Connector::to_replica(dialler.clone(), 3), &at_2)
        .await
        .unwrap_err();
    assert!(e.contains("answered as replica 2, not replica 3"), "{e}");
    // Not a node's certificate either (refused already as no replica's).
    let e = dial(Connector::to_replica(dialler.clone(), 2), &node_served)
        .await
        .unwrap_err();
    assert!(e.contains("not a controller replica"), "{e}");
    // Any replica will do for a connection that asks for none in particular.
    dial(Connector::new(dialler), &at_2).await.unwrap();
}
