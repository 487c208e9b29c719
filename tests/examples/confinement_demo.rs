//! `confinement_demo <attack-worker>`: a hostile worker tries to escape, first under
//! `Confinement::none()` (every attempt works), then under the default (every attempt is
//! refused). Run by `cargo xtask demo`; exits non-zero if either half does not hold.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Confinement, Host};
use airlock_tests::attack::Attack;

type Error = Box<dyn std::error::Error>;

async fn attempt(bin: &str, policy: Confinement, name: &str, arg: &str) -> Result<String, Error> {
    let host = Host::builder(bin).confinement(policy).spawn().await?;
    let outcome = host
        .call_with_deadline::<Attack>(
            &(name.to_string(), arg.to_string()),
            Instant::now() + Duration::from_secs(20),
        )
        .await;
    host.shutdown().await;
    Ok(match outcome {
        // Escaped: the evidence is whatever the attack read (another process's environment
        // holds NULs), and the terminal must not act on it.
        Ok(evidence) => format!(
            "WORKED ({})",
            evidence.chars().take(30).collect::<String>().escape_debug()
        ),
        Err(CallError::Remote(err)) => format!("refused: {}", err.message()),
        Err(other) => format!("refused: {other}"),
    })
}

/// Forged answers that reached a caller of the sibling.
async fn forge_sibling(bin: &str, policy: Confinement) -> Result<usize, Error> {
    let worker = Host::builder(bin).confinement(policy);
    Ok(airlock_tests::attack::sibling_forgery(worker).await?.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let bin = std::env::args()
        .nth(1)
        .ok_or("usage: confinement_demo <attack-worker>")?;
    let dir = std::env::temp_dir().join(format!("airlock-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let secret = dir.join("secret");
    std::fs::write(&secret, "the host's secret")?;
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let host = std::process::id().to_string();
    let attacks = [
        (
            "read a 0600 file of the host's user",
            "read",
            secret.display().to_string(),
        ),
        ("read /etc/passwd", "read", "/etc/passwd".to_string()),
        (
            "connect to the host's TCP listener",
            "tcp",
            listener.local_addr()?.to_string(),
        ),
        ("signal the host (kill 0)", "kill", host.clone()),
        ("ptrace the host", "ptrace", host.clone()),
        (
            "read the host's environment",
            "read",
            format!("/proc/{host}/environ"),
        ),
    ];
    println!("airlock confinement demo: a hostile worker, unconfined and then under the default\n");
    let mut ok = true;
    for (what, name, arg) in &attacks {
        let open = attempt(&bin, Confinement::none(), name, arg).await?;
        let shut = attempt(&bin, Confinement::strict(), name, arg).await?;
        println!("   {what:<40} none(): {open:<45} default: {shut}");
        ok &= open.starts_with("WORKED") && shut.starts_with("refused");
    }
    let open = forge_sibling(&bin, Confinement::none()).await?;
    let shut = forge_sibling(&bin, Confinement::strict()).await?;
    let open_text = format!("{open} forged answer(s) delivered as Ok");
    println!(
        "   {:<40} none(): {open_text:<45} default: {shut} forged answers delivered",
        "forge a sibling worker's answer"
    );
    ok &= open > 0 && shut == 0;
    let _ = std::fs::remove_dir_all(&dir);
    if !ok {
        return Err(
            "an attack was not live unconfined, or was not refused under the default".into(),
        );
    }
    println!("\n   every attempt worked unconfined and was refused under the default");
    Ok(())
}
