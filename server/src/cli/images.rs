//! `tessera image …`: the image catalog workloads pick their environment from, the
//! registries images may come from, and teams' registry logins (issue 36), decoded into
//! [`CatalogImage`] and [`RegistryLoginView`].

use super::{CliError, Client, R, Remote, Tabular, bookings::team_id, encode, opt, print};
use clap::Subcommand;
use serde_json::json;
use tessera_domain::image::{CatalogImage, RegistryLoginView};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// The catalog you see: platform-wide images and your teams' own.
    List {
        /// Only what this team (id or name) sees.
        #[arg(long)]
        team: Option<String>,
    },
    /// Adds an image to a team's catalog (team admins) or, with `--platform`, to every
    /// team's (platform admins), pinned to the digest its reference names now:
    /// `tessera image add --team ml --name "PyTorch 2.3" ghcr.io/acme/torch:2.3`.
    Add {
        /// The registry reference (`registry/repository:tag` or `…@sha256:…`).
        reference: String,
        #[arg(long)]
        name: String,
        /// The team (id or name) whose catalog it joins.
        #[arg(
            long,
            conflicts_with = "platform",
            required_unless_present = "platform"
        )]
        team: Option<String>,
        /// Platform-wide.
        #[arg(long)]
        platform: bool,
    },
    /// Removes a catalog entry (running workloads keep their image).
    Remove { id: String },
    /// Registries (or repository prefixes) images may come from.
    Registries,
    /// Allows images from a registry or repository prefix (platform admins).
    Allow { entry: String },
    /// Stops allowing an entry (platform admins).
    Disallow { entry: String },
    /// A team's registry logins (team admins): registry and username, never the password.
    Logins {
        #[arg(long)]
        team: Option<String>,
    },
    /// Sets a team's login to a registry (team admins). The password or token is read from
    /// standard input (one line) so it stays out of the shell history.
    Login {
        #[arg(long)]
        team: Option<String>,
        /// The registry host, e.g. `ghcr.io`.
        #[arg(long)]
        registry: String,
        #[arg(long)]
        username: String,
    },
    /// Removes a team's login to a registry (team admins).
    Logout {
        #[arg(long)]
        team: Option<String>,
        #[arg(long)]
        registry: String,
    },
}

impl Tabular for CatalogImage {
    const HEADER: &'static [&'static str] =
        &["id", "name", "scope", "pinned", "requires_cuda", "added_by"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.name.clone(),
            self.team_name
                .clone()
                .unwrap_or_else(|| "platform".to_owned()),
            self.pinned.clone(),
            opt(self.requires_cuda),
            self.added_by.clone(),
        ]
    }
}

impl Tabular for RegistryLoginView {
    const HEADER: &'static [&'static str] = &["registry", "username", "updated_at"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.registry.clone(),
            self.username.clone(),
            self.updated_at.to_rfc3339(),
        ]
    }
}

pub async fn image(remote: &Remote, cmd: ImageCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        ImageCommand::List { team } => {
            let path = match team {
                Some(t) => format!("/api/v1/images?team={}", team_id(&c, Some(t)).await?),
                None => "/api/v1/images".to_owned(),
            };
            let items: Vec<CatalogImage> = c.get(&path).await?;
            print(c.output, &items, &items, "no images in your catalog yet")
        }
        ImageCommand::Add {
            reference,
            name,
            team,
            platform,
        } => {
            let team = match (team, platform) {
                (_, true) => None,
                (t, false) => Some(team_id(&c, t).await?),
            };
            let body = json!({"team_id": team, "name": name, "reference": reference});
            let v: CatalogImage = c
                .call(reqwest::Method::POST, "/api/v1/images", Some(body))
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        ImageCommand::Remove { id } => {
            c.call_empty(
                reqwest::Method::DELETE,
                &format!("/api/v1/images/{}", encode(&id)),
                None,
            )
            .await?;
            eprintln!("removed image {id}");
            Ok(0)
        }
        ImageCommand::Registries => {
            let items: Vec<String> = c.get("/api/v1/registries").await?;
            print_list(&c, &items)
        }
        ImageCommand::Allow { entry } => {
            let items: Vec<String> = c
                .call(
                    reqwest::Method::POST,
                    "/api/v1/registries",
                    Some(json!({"entry": entry})),
                )
                .await?;
            print_list(&c, &items)
        }
        ImageCommand::Disallow { entry } => {
            let items: Vec<String> = c
                .call(
                    reqwest::Method::DELETE,
                    &format!("/api/v1/registries?entry={}", encode(&entry)),
                    None,
                )
                .await?;
            print_list(&c, &items)
        }
        ImageCommand::Logins { team } => {
            let team = team_id(&c, team).await?;
            let items: Vec<RegistryLoginView> = c
                .get(&format!("/api/v1/teams/{}/registry-logins", encode(&team)))
                .await?;
            print(c.output, &items, &items, "no registry logins")
        }
        ImageCommand::Login {
            team,
            registry,
            username,
        } => {
            let team = team_id(&c, team).await?;
            let mut password = String::new();
            std::io::stdin()
                .read_line(&mut password)
                .map_err(|e| CliError::usage(format!("reading the password from stdin: {e}")))?;
            let password = password.trim_end_matches(['\r', '\n']);
            if password.is_empty() {
                return Err(CliError::usage(
                    "give the password or token on standard input, e.g. `echo \"$TOKEN\" | tessera image login …`",
                ));
            }
            let body = json!({"registry": registry, "username": username, "password": password});
            let v: RegistryLoginView = c
                .call(
                    reqwest::Method::PUT,
                    &format!("/api/v1/teams/{}/registry-logins", encode(&team)),
                    Some(body),
                )
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        ImageCommand::Logout { team, registry } => {
            let team = team_id(&c, team).await?;
            c.call_empty(
                reqwest::Method::DELETE,
                &format!(
                    "/api/v1/teams/{}/registry-logins?registry={}",
                    encode(&team),
                    encode(&registry)
                ),
                None,
            )
            .await?;
            eprintln!("removed the login to {registry}");
            Ok(0)
        }
    }
}

/// The allow-list, one entry per line (JSON with `--output json`).
fn print_list(c: &Client, items: &[String]) -> R<i32> {
    if c.output == super::Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(items).unwrap_or_default()
        );
    } else if items.is_empty() {
        eprintln!("no registry is allowed yet");
    } else {
        for i in items {
            println!("{i}");
        }
    }
    Ok(0)
}
