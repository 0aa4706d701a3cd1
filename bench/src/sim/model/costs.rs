//! What each request costs a real control plane: the model's constants and
//! the pure functions that turn a request's shape (objects and bytes read,
//! evaluated, returned; a write's size) into service demands on the two
//! stations (apiserver CPU, etcd) and the memory it holds. No I/O, no clock.
//!
//! Every constant has a default and says where it comes from; `--model-set
//! NAME=VALUE` overrides one (the calibration script uses it), and
//! `bench/MODEL.md` lists them with the measurement that fixed them.

/// Defines [`Constants`] with its defaults, docs and by-name setter in one place.
macro_rules! constants {
    ($( $(#[doc = $doc:expr])+ $name:ident : $default:expr ),* $(,)?) => {
        /// The model's constants (seconds, bytes, or factors; see each field).
        #[derive(Debug, Clone, PartialEq)]
        pub struct Constants {
            $( $(#[doc = $doc])+ pub $name: f64, )*
        }

        impl Default for Constants {
            fn default() -> Self {
                Constants { $( $name: $default, )* }
            }
        }

        impl Constants {
            /// Sets one constant by name (as `--model-set NAME=VALUE` does).
            pub fn set(&mut self, name: &str, value: f64) -> Result<(), String> {
                if !value.is_finite() || value < 0.0 {
                    return Err(format!("{name}: {value} is not a finite non-negative number"));
                }
                match name {
                    $( stringify!($name) => self.$name = value, )*
                    _ => return Err(format!(
                        "unknown model constant {name:?}; known: {}",
                        Self::names().join(", ")
                    )),
                }
                Ok(())
            }

            /// Every constant's name, in declaration order.
            pub fn names() -> Vec<&'static str> {
                vec![$( stringify!($name), )*]
            }

            /// `(name, value, doc)` for each constant, for the model page and `--help`.
            pub fn describe(&self) -> Vec<(&'static str, f64, String)> {
                vec![$( (stringify!($name), self.$name, [$($doc),+].join(" ").trim().to_string()), )*]
            }
        }
    };
}

constants! {
    // --- apiserver CPU (seconds of one core) ---
    /// Per request: authentication, authorization, audit, routing, response headers.
    /// Calibrated: the no-LIST PATCH step of bench/scripts/calibrate.sh.
    request_cpu: 0.0005,
    /// Per write: decoding the body, applying the patch, admission, validation, encoding to storage.
    /// Calibrated: the no-LIST PATCH step.
    write_cpu: 0.0010,
    /// Per byte of an object written (decode + encode of the stored object).
    write_cpu_per_byte: 20e-9,
    /// Per object read from etcd: protobuf decode and conversion to the internal version.
    /// Calibrated: a consistent LIST of 10,000 pods alone (0.66 s, of which etcd about a quarter).
    decode_per_object: 6e-6,
    /// Per byte read from etcd (decoding scales with object size).
    /// Calibrated with encode_per_byte: the apiserver's share of the consistent LIST alone, and
    /// LISTs at 240/min overloading two cores (reference: LIST p50 5.3 s) while 120/min do not.
    decode_per_byte: 7e-9,
    /// Per object evaluated against a selector: GetAttrs + match, the cost Tess.IO profiled
    /// (seed 002: "GetAttrs … costs"); charged for every object read on the etcd path.
    selector_per_object: 1e-6,
    /// Per object taken from the watch cache (copy, filter bookkeeping, conversion).
    /// Measured: bench/scripts/list-scaling.sh's fit of rv=0 LISTs (8.0e-6 s/object with
    /// selector_per_object).
    cache_per_object: 7e-6,
    /// Per byte encoded to JSON and written to the client.
    /// Measured: list-scaling.sh's fit of rv=0 LISTs (5.0e-9 s/byte).
    encode_per_byte: 5e-9,
    /// The scheduler's time slice: a goroutine that becomes runnable while more jobs
    /// than cores are running waits for part of a round (Go preempts every 10 ms).
    quantum: 0.010,
    // --- etcd ---
    /// etcd's cores (etcd runs beside the apiserver; its reads and writes share them).
    etcd_cpus: 1.0,
    /// Per range request (linearizable read: ReadIndex round trip, txn setup).
    etcd_range_cpu: 0.0005,
    /// Per key returned by a range read (bbolt cursor, mvcc revision lookup).
    /// Measured: list-scaling.sh's fit of etcd's CPU per consistent LIST (5.0e-6 s/key).
    etcd_range_per_key: 5e-6,
    /// Per byte returned by a range read (copy out of bbolt, protobuf marshal, gRPC send).
    /// Measured: the same fit (1.6e-9 s/byte).
    etcd_range_per_byte: 1.6e-9,
    /// The share of a range read spent holding the backend's read lock, which
    /// write commits must wait for (Tess.IO: "pods and nodes racing for etcd's lock").
    etcd_range_lock_fraction: 0.3,
    /// etcd CPU per write (raft, apply, mvcc put).
    etcd_write_cpu: 0.0005,
    /// Mean WAL fsync latency per write (exponentially distributed; disk, not CPU).
    etcd_fsync: 0.0015,
    // --- memory (bytes, or bytes per byte) ---
    /// The apiserver's resident memory with nothing cached (binary, caches, goroutines).
    memory_base: 200e6,
    /// Watch-cache memory per byte of stored JSON (decoded objects are ~3x their JSON).
    cache_memory_per_byte: 3.0,
    /// Memory held by a LIST from etcd per byte read, until its response is written:
    /// the decoded objects (the etcd response is freed once decoded; 1.20 builds the whole list).
    /// Calibrated: peak RSS at 240 consistent LISTs/min (reference: 3.9 GB).
    etcd_list_memory_per_byte: 1.0,
    /// Memory held per byte of response encoded: the JSON buffer, filled as the LIST is
    /// encoded (half of it on average over the LIST's life).
    encode_memory_per_byte: 0.5,
    /// Bytes a LIST from etcd allocates and drops per byte read (gRPC buffers, the
    /// protobuf response, objects decoded to the internal version and converted back to v1,
    /// each decoded copy several times its encoded size): garbage until the next collection.
    /// Calibrated: peak RSS at 60 and 120 consistent LISTs/min (real: 1.53 and 2.42 GB,
    /// against 0.74 GB without LISTs).
    etcd_list_garbage_per_byte: 18.0,
    /// Bytes dropped per byte of response encoded (the JSON buffer grows by doubling).
    encode_garbage_per_byte: 2.0,
    /// Bytes dropped per byte of object written (request body decoded, the patch applied
    /// through JSON maps, validation, the stored object encoded twice).
    write_garbage_per_byte: 20.0,
    /// `GOGC`: a collection starts when the heap has grown this many percent over what
    /// the previous one found live (kube-apiserver runs with Go's default, 100).
    gc_percent: 100.0,
    /// Bytes per second Go's background scavenger returns to the kernel (it is capped at
    /// 1% of the CPU and keeps 10% over the heap goal); an order-of-magnitude estimate.
    scavenge_per_second: 64e6,
    // --- restarts ---
    /// Seconds from an OOM kill until the new apiserver accepts connections
    /// (container restart + process start; kube-apiserver takes ~5 s to serve here).
    restart_seconds: 5.0,
}

/// What the apiserver read and sent for one LIST, counted on the snapshot before serving it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ListShape {
    /// Served from etcd (true) or the watch cache.
    pub from_etcd: bool,
    /// From the watch cache after asking etcd for its current revision: a consistent LIST
    /// on a release that serves them from the cache (`sim::kube_version`). One request to
    /// etcd that reads no objects.
    pub revision_check: bool,
    /// Objects read (from etcd: the whole key range; from the cache: the range, or the index hits).
    pub fetched: u64,
    pub fetched_bytes: u64,
    /// Objects tested against the selectors.
    pub evaluated: u64,
    pub returned: u64,
    pub returned_bytes: u64,
}

/// The service demands of one request, in the order it meets them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// apiserver CPU before storage (request handling; for a write, building the new object).
    pub cpu_before: f64,
    /// etcd CPU of a range read (holding the backend lock for `etcd_range_lock_fraction` of it).
    pub etcd_read: f64,
    /// etcd CPU of a write (taking the backend lock), after its fsync.
    pub etcd_write: f64,
    /// apiserver CPU after storage (decode, filter, encode, send).
    pub cpu_after: f64,
    /// Bytes held from the start of the request until its response is written.
    pub memory: f64,
    /// Bytes allocated and dropped on the way (garbage until Go's next collection).
    pub garbage: f64,
}

impl Demand {
    /// apiserver CPU in total.
    pub fn cpu(&self) -> f64 {
        self.cpu_before + self.cpu_after
    }
}

impl Constants {
    /// A LIST: on the etcd path every object of the key range is read, decoded
    /// and evaluated whatever the selector returns; from the cache only what
    /// the cache looks at (the node-name index makes `spec.nodeName=X` cheap).
    pub fn list(&self, s: &ListShape) -> Demand {
        let encode = self.encode_per_byte * s.returned_bytes as f64;
        if s.from_etcd {
            Demand {
                cpu_before: self.request_cpu,
                etcd_read: self.etcd_range_cpu
                    + self.etcd_range_per_key * s.fetched as f64
                    + self.etcd_range_per_byte * s.fetched_bytes as f64,
                etcd_write: 0.0,
                cpu_after: self.decode_per_object * s.fetched as f64
                    + self.decode_per_byte * s.fetched_bytes as f64
                    + self.selector_per_object * s.evaluated as f64
                    + encode,
                memory: self.etcd_list_memory_per_byte * s.fetched_bytes as f64
                    + self.encode_memory_per_byte * s.returned_bytes as f64,
                garbage: self.etcd_list_garbage_per_byte * s.fetched_bytes as f64
                    + self.encode_garbage_per_byte * s.returned_bytes as f64,
            }
        } else {
            Demand {
                cpu_before: self.request_cpu,
                // kube-apiserver's `getCurrentResourceVersion`: a range request for the
                // resource's prefix key, which holds no object.
                etcd_read: if s.revision_check {
                    self.etcd_range_cpu
                } else {
                    0.0
                },
                cpu_after: (self.cache_per_object + self.selector_per_object) * s.evaluated as f64
                    + encode,
                memory: self.encode_memory_per_byte * s.returned_bytes as f64,
                garbage: self.encode_garbage_per_byte * s.returned_bytes as f64,
                ..Demand::default()
            }
        }
    }

    /// A GET of one object of `bytes`: a range read of one key when `from_etcd`.
    pub fn get(&self, bytes: u64, from_etcd: bool) -> Demand {
        let mut d = Demand {
            cpu_before: self.request_cpu,
            cpu_after: self.encode_per_byte * bytes as f64,
            garbage: self.encode_garbage_per_byte * bytes as f64,
            ..Demand::default()
        };
        if from_etcd {
            d.garbage += self.etcd_list_garbage_per_byte * bytes as f64;
            d.etcd_read = self.etcd_range_cpu
                + self.etcd_range_per_key
                + self.etcd_range_per_byte * bytes as f64;
            d.cpu_after += self.decode_per_object + self.decode_per_byte * bytes as f64;
        }
        d
    }

    /// A create, update, patch or delete of an object of `bytes`.
    pub fn write(&self, bytes: u64) -> Demand {
        Demand {
            cpu_before: self.request_cpu + self.write_cpu + self.write_cpu_per_byte * bytes as f64,
            etcd_write: self.etcd_write_cpu + self.etcd_range_per_byte * bytes as f64,
            cpu_after: self.encode_per_byte * bytes as f64,
            garbage: self.write_garbage_per_byte * bytes as f64,
            ..Demand::default()
        }
    }

    /// The initial state a WATCH sends from the cache (`resourceVersion` unset or 0).
    pub fn watch_start(&self, s: &ListShape) -> Demand {
        self.list(&ListShape {
            from_etcd: false,
            ..*s
        })
    }

    /// Filling the watch cache after a restart: the reflector LISTs every
    /// resource from etcd and decodes it.
    pub fn cache_fill(&self, objects: u64, bytes: u64) -> Demand {
        let mut d = self.list(&ListShape {
            from_etcd: true,
            fetched: objects,
            fetched_bytes: bytes,
            ..ListShape::default()
        });
        // Counted in the new process's base memory once the cache is filled;
        // a restart is not itself killed for memory.
        d.memory = 0.0;
        d.garbage = 0.0;
        d
    }

    /// Resident memory with the watch cache holding `cached_bytes` of objects.
    pub fn base_memory(&self, cached_bytes: u64) -> f64 {
        self.memory_base + self.cache_memory_per_byte * cached_bytes as f64
    }

    /// The Go runtime settings of the modeled apiserver.
    pub fn heap_params(&self) -> super::heap::HeapParams {
        super::heap::HeapParams {
            gc_percent: self.gc_percent,
            scavenge_per_second: self.scavenge_per_second,
        }
    }
}

/// Processor sharing with a finite time slice: a job that arrives while `n`
/// jobs already share `cores` waits, before it first runs, for a share `u` in
/// [0,1) of the round the others take (`n + 1 - cores` slices over the cores).
/// With a free core it runs at once.
pub fn round_wait(quantum: f64, cores: f64, n: usize, u: f64) -> f64 {
    let behind = (n as f64 + 1.0 - cores).max(0.0);
    u.clamp(0.0, 1.0) * quantum * behind / cores.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10,000 pods of 3.3 KB, as the reference measurement.
    fn all_pods(from_etcd: bool) -> ListShape {
        ListShape {
            from_etcd,
            revision_check: false,
            fetched: 10_000,
            fetched_bytes: 33_000_000,
            evaluated: 10_000,
            returned: 10_000,
            returned_bytes: 33_000_000,
        }
    }

    #[test]
    fn a_consistent_list_costs_more_than_one_from_the_cache() {
        let c = Constants::default();
        let etcd = c.list(&all_pods(true));
        let cache = c.list(&all_pods(false));
        assert!(etcd.etcd_read > 0.1, "{etcd:?}");
        assert_eq!(cache.etcd_read, 0.0);
        assert!(
            etcd.cpu() + etcd.etcd_read > 2.0 * cache.cpu(),
            "{etcd:?} {cache:?}"
        );
        assert!(etcd.memory > 2.0 * cache.memory);
        // Alone, the full consistent LIST takes about the reference's 0.66 s.
        let alone = etcd.cpu() + etcd.etcd_read;
        assert!((0.4..1.0).contains(&alone), "{alone}");
    }

    #[test]
    fn a_node_name_selector_reads_everything_from_etcd_but_little_from_the_cache() {
        let c = Constants::default();
        // spec.nodeName=node-7 among 200 nodes: 50 of 10,000 pods returned.
        let on_etcd = ListShape {
            returned: 50,
            returned_bytes: 165_000,
            ..all_pods(true)
        };
        let indexed = ListShape {
            from_etcd: false,
            revision_check: false,
            fetched: 50,
            fetched_bytes: 165_000,
            evaluated: 50,
            returned: 50,
            returned_bytes: 165_000,
        };
        let full = c.list(&all_pods(true));
        let sel = c.list(&on_etcd);
        let idx = c.list(&indexed);
        let total = |d: &Demand| d.cpu() + d.etcd_read;
        // About a full read on the etcd path (all but the encoding of what is dropped) …
        assert!(total(&sel) > 0.5 * total(&full), "{sel:?} vs {full:?}");
        assert!(sel.memory > 0.5 * full.memory);
        // … and a hundredth of it from the cache.
        assert!(total(&idx) < 0.01 * total(&full), "{idx:?}");
    }

    /// The consistent LIST of 10,000 pods as each release serves it (`sim::kube_version`):
    /// 1.20 reads every pod from etcd; 1.37 asks etcd for its revision and reads the cache.
    #[test]
    fn a_consistent_list_reads_etcd_on_1_20_and_only_its_revision_on_1_37() {
        use crate::sim::kube_version::{CacheState, KubeVersion, ListRead, ServedBy};
        let c = Constants::default();
        let cache = CacheState {
            ready: true,
            oldest: 1,
            newest: 10_000,
        };
        let demand = |v: KubeVersion| {
            let shape = match v.list_store(ListRead::Consistent, cache, false) {
                ServedBy::Etcd => all_pods(true),
                ServedBy::Cache { revision_check } => ListShape {
                    revision_check,
                    ..all_pods(false)
                },
            };
            c.list(&shape)
        };
        let old = demand(KubeVersion::V1_20);
        let new = demand(KubeVersion::V1_37);
        // 1.20: a range read of 10,000 keys and 33 MB.
        let range = c.etcd_range_cpu + c.etcd_range_per_key * 1e4 + c.etcd_range_per_byte * 33e6;
        assert!((old.etcd_read - range).abs() < 1e-9, "{old:?}");
        // 1.37: one revision request, no object read from etcd, nothing decoded from it.
        assert_eq!(new.etcd_read, c.etcd_range_cpu, "{new:?}");
        assert!(new.etcd_read < 0.01 * old.etcd_read);
        assert!(new.memory < 0.5 * old.memory && new.garbage < 0.5 * old.garbage);
        assert!(new.cpu() < old.cpu());
        // Encoding what is sent costs the same on both.
        assert!(new.cpu_after >= c.encode_per_byte * 33e6);
    }

    #[test]
    fn writes_touch_etcd_and_the_cpu_a_little() {
        let c = Constants::default();
        let w = c.write(3_300);
        assert!(w.etcd_write > 0.0 && w.cpu() > 0.0 && w.cpu() < 0.01);
        assert_eq!(w.etcd_read, 0.0);
    }

    #[test]
    fn constants_are_set_by_name_and_refuse_typos() {
        let mut c = Constants::default();
        c.set("quantum", 0.02).unwrap();
        assert_eq!(c.quantum, 0.02);
        assert!(c.set("quantumm", 1.0).unwrap_err().contains("unknown"));
        assert!(c.set("quantum", -1.0).is_err());
        assert!(c.set("quantum", f64::NAN).is_err());
        let d = c.describe();
        assert_eq!(d.len(), Constants::names().len());
        assert!(d.iter().all(|(_, _, doc)| !doc.is_empty()));
    }

    #[test]
    fn round_wait_only_when_the_cores_are_taken() {
        assert_eq!(round_wait(0.01, 2.0, 0, 0.9), 0.0);
        assert_eq!(round_wait(0.01, 2.0, 1, 0.9), 0.0);
        // 21 LISTs on 2 cores: up to 10 slices of 10 ms.
        assert!((round_wait(0.01, 2.0, 21, 1.0) - 0.1).abs() < 1e-12);
        assert!((round_wait(0.01, 2.0, 21, 0.5) - 0.05).abs() < 1e-12);
    }
}
