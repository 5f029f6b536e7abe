//! The image store from outside: `weir images` and the admin address
//! (digests, corrupt and truncated images refused by digest, roots that
//! hold across processes, the sweep), and a run of what was stored.

mod common;

use std::process::Stdio;

use common::programs::{
    admin, cmdprobe, data_dir, image_file, push, sha256_hex, spawn, wait_until, weir_in as weir,
};
use common::{Weir, guest};

#[test]
fn an_image_runs_by_digest_and_a_corrupt_or_truncated_one_is_refused_by_digest() {
    let data = data_dir("digest");
    let probe = cmdprobe();
    let bytes = std::fs::read(&probe).unwrap();
    let digest = push(&data, &probe);
    assert_eq!(
        digest,
        format!("sha256:{}", sha256_hex(&bytes)),
        "named by the SHA-256 of its bytes"
    );
    let again = weir(&data, &["images", "push", &probe], b"");
    assert!(again.out().contains("already stored"), "{}", again.out());
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(0), "exiting with 0\n")
    );
    let compiled = || {
        std::fs::read_dir(data.join("images/compiled"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(digest.trim_start_matches("sha256:"))
            })
            .count()
    };
    assert_eq!(compiled(), 1, "its compiled code is cached by digest");
    // A second run takes that artifact as it is: compiling again would
    // have written a new file in its place (a new inode).
    let artifact = || {
        use std::os::unix::fs::MetadataExt;
        let hex = digest.trim_start_matches("sha256:");
        std::fs::read_dir(data.join("images/compiled"))
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.file_name().to_string_lossy().starts_with(hex))
            .map(|e| e.metadata().unwrap().ino())
            .expect("the artifact")
    };
    let first = artifact();
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(artifact(), first, "the second run compiled it again");

    let file = image_file(&data, &digest);
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x01;
    std::fs::write(&file, &flipped).unwrap();
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(ran.code, Some(126), "{}", ran.stderr);
    assert!(
        ran.stderr.starts_with(&format!(
            "weir: image_corrupt: image {digest} is corrupt: its {} bytes hash to sha256:",
            bytes.len()
        )),
        "{}",
        ran.stderr
    );
    assert_eq!(ran.stdout, b"", "nothing of it ran");

    std::fs::write(&file, &bytes[..bytes.len() - 1]).unwrap();
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(ran.code, Some(126));
    assert!(
        ran.stderr.starts_with(&format!(
            "weir: image_corrupt: image {digest} is corrupt: its {} bytes hash to",
            bytes.len() - 1
        )),
        "{}",
        ran.stderr
    );

    let ran = weir(&data, &["images", "rm", &digest], b"");
    assert_eq!(
        (ran.code, ran.out()),
        (Some(0), format!("{digest}  removed\n"))
    );
    assert_eq!(compiled(), 0, "its compiled code went with it");
    let ran = weir(&data, &["run", &digest], b"");
    assert_eq!(ran.code, Some(126));
    assert_eq!(
        ran.stderr,
        format!("weir: image_not_found: no image {digest} in the store\n")
    );
    let ran = weir(&data, &["run", "sha256:1234"], b"");
    assert_eq!(ran.code, Some(126), "{}", ran.stderr);
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn the_sweep_spares_what_a_run_in_another_process_holds_and_removes_orphans() {
    let data = data_dir("sweep");
    let held = push(&data, &cmdprobe());
    let orphan = push(&data, guest("wc").to_str().unwrap());
    // An abandoned push: a partial file whose writer is gone.
    let partial = data.join("images/.partial-abandoned");
    std::fs::write(&partial, b"half an image").unwrap();

    // A run in its own process holds the probe's image while it spins.
    let mut running = spawn(
        &data,
        &[
            "run",
            "--limit",
            "run_time_limit_ms=60000",
            &held,
            "--",
            "spin",
        ],
        Stdio::null(),
    );
    wait_until("the run holds its image", || {
        let list = weir(&data, &["images", "list", "--json"], b"");
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        list["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["digest"] == held.as_str() && i["rooted"] == true)
    });
    let ran = weir(&data, &["images", "rm", &held], b"");
    assert_eq!(ran.code, Some(1));
    assert_eq!(
        ran.stderr,
        format!("weir: image {held} is in use (a run or process holds it)\n")
    );

    let ran = weir(&data, &["images", "sweep"], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(
        ran.out(),
        format!("{orphan}  removed\n{held}  kept (in use)\n")
    );
    assert!(
        ran.stderr
            .contains("swept 1 images and 1 unfinished pushes")
    );
    assert!(image_file(&data, &held).exists());
    assert!(!image_file(&data, &orphan).exists());
    assert!(!partial.exists());

    // Its holder gone (killed, not ended: the kernel drops the root).
    running.kill().unwrap();
    running.wait().unwrap();
    let ran = weir(&data, &["images", "sweep", "--keep", &orphan], b"");
    assert_eq!(ran.out(), format!("{held}  removed\n"));
    let list = weir(&data, &["images", "list"], b"");
    assert_eq!(
        list.out(),
        "0 images, 0 B, 0 in use\n",
        "the store is empty"
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_address_pushes_lists_removes_and_sweeps_images_for_the_token_holder_only() {
    let data = data_dir("admin");
    let weir = Weir::start(
        &guest("hello"),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--limit",
            "max_image_bytes=262144",
        ],
    );
    let bytes = std::fs::read(cmdprobe()).unwrap();
    let digest = format!("sha256:{}", sha256_hex(&bytes));

    let refused = admin(&weir, "PUT", "/images", bytes.clone(), false).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"], "admin_token_required");
    assert_eq!(
        admin(&weir, "GET", "/images", vec![], false).await.status,
        401
    );
    assert!(
        !data
            .join("images")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().ends_with(".wasm") })
    );

    let pushed = admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    assert_eq!(pushed.status, 201, "{:?}", pushed.body);
    assert_eq!(pushed.json()["digest"], digest.as_str());
    assert_eq!(pushed.json()["bytes"], bytes.len());
    let again = admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    assert_eq!(
        (again.status.as_u16(), &again.json()["stored"]),
        (200, &false.into())
    );

    let big = admin(&weir, "PUT", "/images", vec![0u8; 300_000], true).await;
    assert_eq!(big.status, 413);
    assert_eq!(big.json()["error"], "image_too_large");

    let list = admin(&weir, "GET", "/images", vec![], true).await.json();
    assert_eq!(list["images"].as_array().unwrap().len(), 1);
    assert_eq!(list["images"][0]["digest"], digest.as_str());
    assert_eq!(list["images"][0]["bytes"], bytes.len());

    // The store is shared: `weir run` of what the server stored, while the
    // server runs.
    let ran = self::weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(0), "exiting with 0\n"),
        "{}",
        ran.stderr
    );

    let bad = admin(&weir, "DELETE", "/images/sha256:xyz", vec![], true).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"], "image_digest_invalid");
    let gone = admin(&weir, "DELETE", &format!("/images/{digest}"), vec![], true).await;
    assert_eq!(gone.json()["deleted"], true, "{:?}", gone.body);
    let gone = admin(&weir, "DELETE", &format!("/images/{digest}"), vec![], true).await;
    assert_eq!(gone.json()["deleted"], false);

    admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    let swept = admin(&weir, "POST", "/images/sweep", vec![], true)
        .await
        .json();
    assert_eq!(swept["removed"][0], digest.as_str(), "{swept}");
    assert_eq!(swept["bytes_freed"], bytes.len());
    drop(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// A push answers once the image is compiled for the programs that may
/// run it, so that the first spawn of a large image does not compile it
/// inside the spawning turn's deadline; bytes that do not compile are
/// stored as pushed, and the answer says why they will not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_image_is_compiled_before_the_push_is_answered() {
    let data = data_dir("compiled-at-push");
    let weir = common::programs::serve_runner(&data, &[]);
    let bytes = std::fs::read(cmdprobe()).unwrap();
    let hex = sha256_hex(&bytes);
    let artifacts = |hex: &str| {
        std::fs::read_dir(data.join("images/compiled"))
            .map(|dir| {
                dir.filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with(hex)
                })
                .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(artifacts(&hex), 0, "nothing is compiled before the push");

    let pushed = admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    assert_eq!(pushed.status, 201, "{:?}", pushed.body);
    assert_eq!(pushed.json()["compiled"], true, "{:?}", pushed.body);
    assert_eq!(
        artifacts(&hex),
        1,
        "its code is in the cache when the push is answered"
    );

    // Not a component: stored, and not compiled.
    let junk = b"\0asm\x01\0\0\0 not a component".to_vec();
    let refused = admin(&weir, "PUT", "/images", junk.clone(), true).await;
    assert_eq!(refused.status, 201, "{:?}", refused.body);
    assert_eq!(refused.json()["compiled"], false, "{:?}", refused.body);
    let why = refused.json()["compile_error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("does not compile"), "{why}");
    assert_eq!(artifacts(&sha256_hex(&junk)), 0);

    // An actor's first spawn of it loads that code, and runs it.
    let spawned = common::programs::call(
        &weir,
        "POST",
        &format!("/r/o/spawn/sha256:{hex}?contract=lifetime&arg=exit&arg=0"),
        b"",
    )
    .await;
    assert_eq!(spawned.status, 200, "{}", spawned.text());
    let pid = spawned.json()["pid"].as_u64().unwrap();
    let waited = common::programs::call(
        &weir,
        "POST",
        &format!("/r/o/wait/{pid}?timeout=20000"),
        b"",
    )
    .await;
    assert_eq!(waited.json()["exited"]["exit_code"], 0, "{}", waited.text());
    assert_eq!(artifacts(&hex), 1, "and nothing is compiled again");
    drop(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// An image's compiler is bounded as an app's is: a push of Wasm built to
/// exhaust Cranelift's memory is stored as pushed, not compiled, and the
/// answer names the limit; the next image compiles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_image_that_exhausts_the_compiler_is_stored_uncompiled_naming_the_limit() {
    use common::hostile::{COMPILER_LIMIT, COMPILER_REFUSAL, compile_bomb};
    let data = data_dir("compile-bomb");
    let weir = common::programs::serve_runner(&data, &[COMPILER_LIMIT]);
    let bomb = std::fs::read(compile_bomb(2, 100_000)).unwrap();
    let pushed = admin(&weir, "PUT", "/images", bomb.clone(), true).await;
    assert_eq!(pushed.status, 201, "{:?}", pushed.body);
    assert_eq!(pushed.json()["compiled"], false, "{:?}", pushed.body);
    let why = pushed.json()["compile_error"].as_str().unwrap().to_string();
    assert!(why.contains(COMPILER_REFUSAL), "{why}");
    let compiled: Vec<String> = std::fs::read_dir(data.join("images/compiled"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !compiled.iter().any(|f| f.starts_with(&sha256_hex(&bomb))),
        "{compiled:?}"
    );
    let probe = admin(
        &weir,
        "PUT",
        "/images",
        std::fs::read(cmdprobe()).unwrap(),
        true,
    )
    .await;
    assert_eq!(probe.json()["compiled"], true, "{:?}", probe.body);
    drop(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// Runs `weir <args>` in `cwd`, at most a minute: its exit code, stdout
/// and stderr.
fn weir_in_dir(cwd: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = common::weir_command()
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::exit_within(&mut child, std::time::Duration::from_secs(60))
        .expect("weir exits within a minute");
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), out, err)
}

#[test]
fn a_digest_names_the_stores_image_and_a_file_of_that_name_must_hash_to_it() {
    let data = data_dir("digest-name");
    let digest = push(&data, &cmdprobe());
    // In the working directory, a file named like that digest that holds
    // other bytes.
    let cwd = weir_scratch::dir("digest-name-cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::copy(guest("wc"), cwd.join(&digest)).unwrap();
    let data_arg = data.to_str().unwrap();
    // The store's image runs, never the file.
    let (code, out, err) = weir_in_dir(
        &cwd,
        &["run", "--data-dir", data_arg, &digest, "--", "exit", "0"],
    );
    assert_eq!((code, out.as_str()), (Some(0), "exiting with 0\n"), "{err}");
    // With no such image stored, the file is taken only if it hashes to
    // its name: it does not, and nothing runs.
    let ran = weir(&data, &["images", "rm", &digest], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let (code, out, err) = weir_in_dir(
        &cwd,
        &["run", "--data-dir", data_arg, &digest, "--", "exit", "0"],
    );
    assert_eq!(code, Some(126), "{err}");
    assert!(
        err.contains("image_corrupt") && err.contains("not to the digest it is named"),
        "{err}"
    );
    assert_eq!(out, "", "nothing ran");
    // One spelling of a digest: a sign is not a hex digit.
    let signed = format!("sha256:{}", "+0".repeat(32));
    let ran = weir(&data, &["images", "rm", &signed], b"");
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("is not an image digest"),
        "{}",
        ran.stderr
    );
}
