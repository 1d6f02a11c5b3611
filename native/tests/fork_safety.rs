//! No process-wide lock that a forked child could find held.
//!
//! `Store.verify` forks worker processes from a parent whose other threads may be hashing.
//! A child has only the forking thread: a `OnceLock` or `LazyLock` another thread was
//! filling at the fork, or a static `Mutex` it held, stays taken in the child for good,
//! and the child's first hash waits on it forever. Threads are started per call and joined
//! before it returns (`par.rs`, whose core count is cached in an atomic). This keeps a
//! process-wide lock from slipping in.

const SOURCES: [(&str, &str); 6] = [
    ("content.rs", include_str!("../src/content.rs")),
    ("hash.rs", include_str!("../src/hash.rs")),
    ("json.rs", include_str!("../src/json.rs")),
    ("lib.rs", include_str!("../src/lib.rs")),
    ("par.rs", include_str!("../src/par.rs")),
    ("tree.rs", include_str!("../src/tree.rs")),
];

fn offending(src: &str) -> Vec<(usize, String)> {
    src.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let code = line.split("//").next().unwrap_or("");
            let lazy = code.contains("OnceLock") || code.contains("LazyLock") || code.contains("lazy_static");
            let global_lock =
                code.trim_start().starts_with("static") && (code.contains("Mutex") || code.contains("RwLock"));
            (lazy || global_lock).then(|| (i + 1, line.trim().to_string()))
        })
        .collect()
}

#[test]
fn no_source_holds_a_lazy_or_static_lock() {
    for (name, src) in SOURCES {
        let found = offending(src);
        assert!(
            found.is_empty(),
            "{name}: a process-wide lock a forked child could find held: {found:?}"
        );
    }
}

#[test]
fn every_source_file_is_checked() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    on_disk.sort();
    let listed: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(on_disk, listed, "add each source file to SOURCES");
}

#[test]
fn the_check_finds_each_kind_of_lock_and_passes_comments() {
    assert_eq!(offending("static P: OnceLock<u8> = OnceLock::new();").len(), 1);
    assert_eq!(offending("static S: Mutex<u8> = Mutex::new(0);").len(), 1);
    assert_eq!(offending("    static L: LazyLock<u8> = LazyLock::new(|| 1);").len(), 1);
    assert!(offending("// a OnceLock here would hang a child").is_empty());
    assert!(offending("let m = Mutex::new(0); // per call, not static").is_empty());
}
