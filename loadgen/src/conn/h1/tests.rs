use super::*;
use tokio::net::TcpListener;

/// A server that answers one request on one connection with `pieces`
/// (written separately, so parsing must cope with any split), then closes
/// if `close`, else keeps the connection open until the client is done.
async fn serve(pieces: Vec<Vec<u8>>, close: bool) -> (Conn, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("read");
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&buf[..n]);
        }
        for p in pieces {
            s.write_all(&p).await.expect("write");
            s.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if !close {
            // Until the client closes.
            let _ = s.read(&mut buf).await;
        }
        got
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    (Conn::new(Stream::Plain(tcp)), server)
}

fn get(path: &str) -> Planned {
    Planned {
        method: http::Method::GET,
        path: path.to_string(),
        body: None,
    }
}

async fn exchange(pieces: &[&[u8]], close: bool, keep: usize) -> Result<(Response, bool), Failure> {
    let (mut conn, _server) = serve(pieces.iter().map(|p| p.to_vec()).collect(), close).await;
    write_request(conn.request_buf(), &get("/x"), "", b"host: h\r\n", None).expect("request");
    conn.exchange(|_| keep, true).await
}

#[tokio::test]
async fn reads_a_content_length_body_split_anywhere() {
    let (resp, reusable) = exchange(
        &[
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"ngth: 10\r\nX-Tollgate-Lane: workload-low\r\n\r\n01234",
            b"56789",
        ],
        false,
        4,
    )
    .await
    .expect("response");
    assert_eq!((resp.status, resp.bytes, reusable), (200, 10, true));
    assert_eq!(resp.kept, b"0123");
    assert_eq!(
        resp.class,
        Some((ClassSource::Lane, "workload-low".to_string()))
    );
}

#[tokio::test]
async fn decodes_chunked_bodies_with_trailers() {
    let (resp, reusable) = exchange(
        &[
            b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\nX-Kubernetes-PF-PriorityLevel-UID: u-1\r\n\r\n5\r\nhel",
            b"lo\r\n6;ext=1\r\n world\r",
            b"\n0\r\nTrailer: x\r\n",
            b"\r\n",
        ],
        false,
        64,
    )
    .await
    .expect("response");
    assert_eq!((resp.status, resp.bytes, reusable), (429, 11, true));
    assert_eq!(resp.kept, b"hello world");
    assert_eq!(resp.retry_after, Some(Duration::from_secs(3)));
    assert_eq!(
        resp.class,
        Some((ClassSource::PriorityLevel, "u-1".to_string()))
    );
}

#[tokio::test]
async fn a_body_without_length_ends_with_the_connection() {
    let (resp, reusable) = exchange(&[b"HTTP/1.1 200 OK\r\n\r\nabc", b"def"], true, 0)
        .await
        .expect("response");
    assert_eq!((resp.bytes, reusable), (6, false));
    assert!(resp.kept.is_empty());
}

#[tokio::test]
async fn no_body_for_204_and_close_is_honoured() {
    let (resp, reusable) = exchange(
        &[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"],
        false,
        0,
    )
    .await
    .expect("response");
    assert_eq!((resp.status, resp.bytes, reusable), (204, 0, false));
}

#[tokio::test]
async fn broken_responses_are_classified() {
    let short = exchange(
        &[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
        true,
        0,
    )
    .await;
    assert!(matches!(
        short,
        Err(Failure {
            class: ErrorClass::Connection,
            ..
        })
    ));
    let garbage = exchange(&[b"SMTP ready\r\n\r\n"], true, 0).await;
    assert!(matches!(
        garbage,
        Err(Failure {
            class: ErrorClass::Protocol,
            ..
        })
    ));
    let bad_chunk = exchange(
        &[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
        true,
        0,
    )
    .await;
    assert!(matches!(
        bad_chunk,
        Err(Failure {
            class: ErrorClass::Protocol,
            ..
        })
    ));
    // A fresh connection closed before any response is not retried.
    let closed = exchange(&[], true, 0).await;
    assert!(matches!(
        closed,
        Err(Failure {
            class: ErrorClass::Connection,
            fresh_retry: false
        })
    ));
}

#[tokio::test]
async fn carries_several_requests_and_sees_a_close_while_idle() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 4096];
        for _ in 0..2 {
            let _ = s.read(&mut buf).await.expect("read");
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await
                .expect("write");
        }
        // Closed while idle, as a server's keep-alive timeout does.
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut conn = Conn::new(Stream::Plain(tcp));
    for _ in 0..2 {
        write_request(conn.request_buf(), &get("/y"), "/prefix", b"", None).expect("request");
        let (resp, reusable) = conn.exchange(|_| 0, true).await.expect("response");
        assert_eq!((resp.status, resp.bytes, reusable), (200, 2, true));
    }
    server.await.expect("server");
    // The FIN may take a moment to be seen by the reactor.
    let mut alive = true;
    for _ in 0..100 {
        alive = std::future::poll_fn(|cx| Poll::Ready(conn.poll_usable(cx))).await;
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!alive);
    // A reused connection that fails before a response byte may be retried.
    write_request(conn.request_buf(), &get("/z"), "", b"", None).expect("request");
    let failed = conn.exchange(|_| 0, true).await;
    assert!(matches!(
        failed,
        Err(Failure {
            fresh_retry: true,
            ..
        })
    ));
}

#[test]
fn serializes_requests_and_refuses_bad_paths() {
    let mut out = Vec::new();
    let auth = http::HeaderValue::from_static("Bearer t");
    let create = Planned {
        method: http::Method::POST,
        path: "/api/v1/namespaces/n/pods".to_string(),
        body: Some(("application/json", bytes::Bytes::from_static(b"{}"))),
    };
    let fixed = fixed_headers(
        &http::HeaderValue::from_static("h:1"),
        b"application/json",
        b"loadgen/0.1",
    );
    write_request(&mut out, &create, "/k8s", &fixed, Some(&auth)).expect("request");
    assert_eq!(
        String::from_utf8(out.clone()).expect("utf8"),
        "POST /k8s/api/v1/namespaces/n/pods HTTP/1.1\r\nhost: h:1\r\naccept: application/json\r\nuser-agent: loadgen/0.1\r\nauthorization: Bearer t\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    );
    assert_eq!(
        write_request(&mut out, &get("/a b"), "", b"", None),
        Err(ErrorClass::Protocol)
    );
    assert_eq!(
        write_request(&mut out, &get("/a\r\nx: y"), "", b"", None),
        Err(ErrorClass::Protocol)
    );
}
