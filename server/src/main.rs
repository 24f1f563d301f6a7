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
        Command::Backup(args) => {
            tessera_server::backup(args.database_url.expose(), &args.path).await?;
            println!(
                "backup written to {} (readable by you only; the data key is not in it: \
                 keep a copy of the key apart from it)",
                args.path.display()
            );
            Ok(())
        }
        Command::Restore(args) => {
            tessera_server::restore(args.database_url.expose(), &args.path).await?;
            println!("restored from {}", args.path.display());
            Ok(())
        }
        Command::Job { remote, command } => {
            exit_with(tessera_server::cli::job(&remote, command).await)
        }
        Command::Notebook { remote, command } => {
            exit_with(tessera_server::cli::notebook(&remote, command).await)
        }
        Command::Login(args) => exit_with(tessera_server::cli::login(args).await),
        Command::Alloc { remote, command } => {
            exit_with(tessera_server::cli::alloc(&remote, command).await)
        }
        Command::Quota { remote, command } => {
            exit_with(tessera_server::cli::quota(&remote, command).await)
        }
        Command::Usage { remote, args } => {
            exit_with(tessera_server::cli::usage(&remote, args).await)
        }
        Command::Export { remote, command } => {
            exit_with(tessera_server::cli::export(&remote, command).await)
        }
        Command::Node { remote, command } => {
            exit_with(tessera_server::cli::node(&remote, command).await)
        }
        Command::Image { remote, command } => {
            exit_with(tessera_server::cli::image(&remote, command).await)
        }
        Command::Exec { remote, args } => exit_with(tessera_server::cli::exec(&remote, args).await),
        Command::Booking { remote, command } => {
            exit_with(tessera_server::cli::booking(&remote, command).await)
        }
        Command::Completions(args) => std::process::exit(tessera_server::cli::completions(&args)),
        Command::Plan(args) => {
            let read = |p: &std::path::Path| {
                std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
            };
            let inputs = read(&args.cluster).and_then(|c| Ok((c, read(&args.requests)?)));
            let result = inputs.and_then(|(cluster, requests)| {
                tessera_domain::planner::cli::run_plan(
                    &cluster,
                    &args.cluster.display().to_string(),
                    &requests,
                    &args.requests.display().to_string(),
                )
                .map_err(|e| e.to_string())
            });
            match result {
                Ok(plan) => {
                    println!("{plan}");
                    Ok(())
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(2)
                }
            }
        }
    }
}

fn exit_with(r: Result<i32, tessera_server::cli::CliError>) -> ! {
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {}", e.message);
            std::process::exit(e.code)
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
