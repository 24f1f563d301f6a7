use clap::Parser;
use tessera_server::config::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            tessera_server::observability::init_tracing(config.log_format);
            let listener = tokio::net::TcpListener::bind(config.bind)
                .await
                .map_err(|e| anyhow::anyhow!("TESSERA_BIND (--bind) {}: {e}", config.bind))?;
            tessera_server::run(*config, listener, shutdown_signal()).await
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
