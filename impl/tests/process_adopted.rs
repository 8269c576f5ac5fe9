//! [`contract_impl::process::adopted::sweep`] against real children. Its own test
//! binary: a sweep kills every child of the process that is not listed, so it must not
//! share a process with tests that spawn children of their own.

use std::collections::HashSet;

use contract_impl::process::adopted::{children, sweep};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

#[tokio::test]
async fn an_unmanaged_child_is_killed_and_reaped_and_a_managed_one_is_left() {
    let mut managed = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let adopted = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let adopted_pid = Pid::from_raw(adopted.id().cast_signed());
    // Ours to drop without waiting: the sweep reaps it.
    std::mem::forget(adopted);
    let keep = managed.id().cast_signed();
    // Other tests of this binary may have children of their own: list them as managed.
    let others: HashSet<i32> = children()
        .into_iter()
        .map(Pid::as_raw)
        .filter(|p| *p != adopted_pid.as_raw())
        .collect();
    let reaped = sweep(|| {
        let mut known = others.clone();
        known.insert(keep);
        known
    })
    .await;
    assert!(reaped >= 1);
    assert_eq!(kill(adopted_pid, None), Err(Errno::ESRCH), "not reaped");
    assert_eq!(
        managed.try_wait().unwrap(),
        None,
        "a managed child was touched"
    );
    managed.kill().unwrap();
    managed.wait().unwrap();
}
