use super::*;
use crate::sim::resources;
use serde_json::json;

fn pods() -> usize {
    resources::index_of(resources::by_name("pods").unwrap())
}

fn pod(name: &str, v: u64) -> serde_json::Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":"ns","labels":{"v":v.to_string()}},"spec":{"nodeName":"n1"}})
}

fn put(s: &Store, name: &str, v: u64, expect: Option<u64>) -> Result<Arc<Event>, StoreError> {
    let def = resources::by_name("pods").unwrap();
    s.write(
        pods(),
        &format!("ns/{name}"),
        expect,
        Write::Put(pod(name, v)),
        |val, rv| Obj::new(def, val, rv),
    )
}

fn del(s: &Store, name: &str) -> Result<Arc<Event>, StoreError> {
    let def = resources::by_name("pods").unwrap();
    s.write(
        pods(),
        &format!("ns/{name}"),
        None,
        Write::Delete,
        |val, rv| Obj::new(def, val, rv),
    )
}

#[test]
fn writes_are_ordered_and_conditional() {
    let s = Store::new(resources::slots(), 100);
    let a = put(&s, "a", 1, Some(0)).unwrap();
    assert_eq!(a.kind, EventType::Added);
    assert_eq!(
        put(&s, "a", 1, Some(0)).unwrap_err(),
        StoreError::AlreadyExists
    );
    let b = put(&s, "a", 2, Some(a.rv)).unwrap();
    assert_eq!(b.rv, a.rv + 1);
    assert_eq!(b.kind, EventType::Modified);
    // A write that read the object before `b` is stale.
    assert_eq!(
        put(&s, "a", 3, Some(a.rv)).unwrap_err(),
        StoreError::Conflict
    );
    assert_eq!(put(&s, "zz", 3, Some(7)).unwrap_err(), StoreError::NotFound);
    let d = del(&s, "a").unwrap();
    assert_eq!(d.kind, EventType::Deleted);
    assert_eq!(d.cur.rv, d.rv);
    assert_eq!(del(&s, "a").unwrap_err(), StoreError::NotFound);
    let stored: serde_json::Value = serde_json::from_slice(&b.cur.json).unwrap();
    assert_eq!(stored["metadata"]["resourceVersion"], b.rv.to_string());
}

#[test]
fn snapshots_at_old_revisions_undo_later_writes() {
    let s = Store::new(resources::slots(), 100);
    put(&s, "a", 1, Some(0)).unwrap();
    let at = put(&s, "b", 1, Some(0)).unwrap().rv;
    put(&s, "c", 1, Some(0)).unwrap();
    put(&s, "a", 2, None).unwrap();
    del(&s, "b").unwrap();
    let then = s.snapshot_at(pods(), at).unwrap();
    let keys: Vec<_> = then.keys().cloned().collect();
    assert_eq!(keys, vec!["ns/a", "ns/b"]);
    assert_eq!(then.get("ns/a").unwrap().labels["v"], "1");
    let (_, now) = s.snapshot(pods());
    assert_eq!(
        now.keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/c"]
    );
}

#[test]
fn history_is_bounded_and_old_revisions_expire() {
    let s = Store::new(resources::slots(), 3);
    let first = put(&s, "a", 0, None).unwrap().rv;
    for i in 1..10 {
        put(&s, "a", i, None).unwrap();
    }
    assert!(matches!(
        s.events_after(pods(), first, 100),
        Err(StoreError::Compacted { .. })
    ));
    assert!(matches!(
        s.snapshot_at(pods(), first),
        Err(StoreError::Compacted { .. })
    ));
    let rv = s.revision();
    let (evs, reached) = s.events_after(pods(), rv - 3, 100).unwrap();
    assert_eq!(reached, rv);
    assert_eq!(
        evs.iter().map(|e| e.rv).collect::<Vec<_>>(),
        vec![rv - 2, rv - 1, rv]
    );
    assert!(s.events_after(pods(), rv, 100).unwrap().0.is_empty());
}

#[test]
fn seeding_starts_history_after_the_seed() {
    let s = Store::new(resources::slots(), 100);
    let def = resources::by_name("pods").unwrap();
    let base = s.next_revision();
    s.seed(
        pods(),
        (0..5).map(|i| Obj::new(def, pod(&format!("p{i}"), 0), base + i)),
    );
    assert_eq!(s.count(pods()), 5);
    assert_eq!(s.revision(), base + 4);
    assert!(s.events_after(pods(), base, 10).is_err());
    assert!(s
        .events_after(pods(), s.revision(), 10)
        .unwrap()
        .0
        .is_empty());
}

fn applied(s: &Store, name: &str, rv: u64, w: Option<u64>) -> Option<Arc<Event>> {
    let def = resources::by_name("pods").unwrap();
    let write = match w {
        Some(v) => Write::Put(pod(name, v)),
        None => Write::Delete,
    };
    s.apply(pods(), &format!("ns/{name}"), rv, write, |val, rv| {
        Obj::new(def, val, rv)
    })
}

#[test]
fn the_watch_cache_applies_storage_revisions_with_gaps() {
    let s = Store::new(resources::slots(), 100);
    s.replace(Vec::new(), 10);
    assert_eq!((s.revision(), s.compacted()), (10, 10));
    // etcd's revisions skip the keys the cache does not serve.
    let a = applied(&s, "a", 12, Some(1)).unwrap();
    assert_eq!((a.rv, a.kind), (12, EventType::Added));
    assert_eq!(s.get(pods(), "ns/a").unwrap().rv, 12);
    s.advance(15);
    assert_eq!(s.revision(), 15);
    let m = applied(&s, "a", 17, Some(2)).unwrap();
    assert_eq!(m.kind, EventType::Modified);
    assert!(
        applied(&s, "a", 16, Some(3)).is_none(),
        "older than the cache"
    );
    assert!(
        applied(&s, "gone", 18, None).is_none(),
        "a delete of nothing"
    );
    assert_eq!(s.revision(), 18);
    let d = applied(&s, "a", 20, None).unwrap();
    assert_eq!((d.kind, d.cur.rv), (EventType::Deleted, 20));
    // Searched by revision, not indexed: from anywhere inside a gap.
    let rvs = |after| {
        s.events_after(pods(), after, 100)
            .unwrap()
            .0
            .iter()
            .map(|e| e.rv)
            .collect::<Vec<_>>()
    };
    assert_eq!(rvs(10), [12, 17, 20]);
    assert_eq!(rvs(13), [17, 20]);
    assert_eq!(rvs(17), [20]);
    assert!(rvs(20).is_empty());
    assert_eq!(s.events_after(pods(), 13, 1).unwrap().1, 17);
    // Snapshots at a revision inside a gap undo what came after it.
    let at14 = s.snapshot_at(pods(), 14).unwrap();
    assert_eq!(at14.get("ns/a").unwrap().rv, 12);
    assert!(s.snapshot_at(pods(), 11).unwrap().is_empty());
}

fn node_write(s: &Store, name: &str, v: u64) {
    let def = resources::by_name("nodes").unwrap();
    let node = json!({"apiVersion":"v1","kind":"Node","metadata":{"name":name,"labels":{"v":v.to_string()}}});
    s.write(
        resources::index_of(def),
        name,
        None,
        Write::Put(node),
        |val, rv| Obj::new(def, val, rv),
    )
    .unwrap();
}

#[test]
fn a_resource_s_watchers_wake_for_its_events_only_and_keep_their_own_window() {
    let s = Store::new(resources::slots(), 3);
    let mut pod_changes = s.subscribe_resource(pods());
    pod_changes.borrow_and_update();
    let start = put(&s, "a", 1, Some(0)).unwrap().rv;
    assert!(pod_changes.has_changed().unwrap());
    pod_changes.borrow_and_update();
    // Node heartbeats do not wake pod watchers, and push the pod event out of the
    // 3-event history without making a pod watch from `start` too old: no pod event
    // after it was lost.
    for v in 0..5 {
        node_write(&s, "n1", v);
    }
    assert!(!pod_changes.has_changed().unwrap());
    assert!(s.compacted() > start);
    let (events, reached) = s.events_after(pods(), start, 10).unwrap();
    assert!(events.is_empty());
    assert_eq!(reached, s.revision());
    // A pod watcher from before the pod event that left the history did miss it.
    assert!(matches!(
        s.events_after(pods(), start - 1, 10),
        Err(StoreError::Compacted { .. })
    ));
}

fn pod_on(name: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":"ns"},"spec":{"nodeName":node}})
}

#[test]
fn the_node_index_follows_binds_moves_and_deletes() {
    let def = resources::by_name("pods").unwrap();
    let s = Store::new(resources::slots(), 100);
    let write = |name: &str, w: Write| {
        s.write(pods(), &format!("ns/{name}"), None, w, |val, rv| {
            Obj::new(def, val, rv)
        })
        .unwrap()
    };
    let on = |node: &str| -> Vec<String> {
        let (rv, map) = s.snapshot_on_node(pods(), node).unwrap();
        assert_eq!(rv, s.revision());
        map.keys().cloned().collect()
    };
    write("a", Write::Put(pod_on("a", "n1")));
    write("b", Write::Put(pod_on("b", "n1")));
    write("c", Write::Put(pod_on("c", "n2")));
    write("p", Write::Put(pod_on("p", "")));
    assert_eq!(on("n1"), ["ns/a", "ns/b"]);
    assert_eq!(on("n2"), ["ns/c"]);
    write("b", Write::Put(pod_on("b", "n2")));
    write("a", Write::Delete);
    write("p", Write::Put(pod_on("p", "n1")));
    assert_eq!(on("n1"), ["ns/p"]);
    assert_eq!(on("n2"), ["ns/b", "ns/c"]);
    assert!(on("n3").is_empty());
    // Nodes are not indexed by node name: callers fall back to a full snapshot.
    let nodes = resources::index_of(resources::by_name("nodes").unwrap());
    assert!(s.snapshot_on_node(nodes, "n1").is_none());
    // A relist rebuilds it.
    let (_, map) = s.snapshot(pods());
    let mut maps = vec![ObjMap::new(); resources::slots()];
    maps[pods()] = map;
    s.replace(maps, s.revision());
    assert_eq!(on("n2"), ["ns/b", "ns/c"]);
}
