mod common;
use common::*;
use dafne_transport::{testsvc, Client};

#[test]
fn echo_over_each_transport() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).expect("connect");
        let mut req = vec![testsvc::OP_ECHO];
        req.extend_from_slice(b"hello");
        let r = c.call(req).unwrap();
        assert_eq!(testsvc::parse_reply(&r).unwrap(), b"hello");
        eprintln!("{tls:?}: {}", c.data_path_info().unwrap());
    }
}
