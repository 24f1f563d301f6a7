//! The UI's live updates (`GET /events`): a stream tells its viewer, within about a second,
//! that something they may read moved, and never that another team's did.

use crate::allocations::{request, set_quota, team};
use crate::on_both_databases;
use crate::support::{AdminClient, Db};
use std::time::Duration;

on_both_databases!(a_stream_tells_its_team_what_moved_and_nothing_of_other_teams,);

/// An open `/events` stream and what it has sent so far.
struct Stream {
    response: reqwest::Response,
    seen: String,
}

impl Stream {
    async fn open(base: &str, token: Option<&str>) -> Result<Stream, u16> {
        let mut r = reqwest::Client::new().get(format!("{base}/events"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let response = r.send().await.expect("events");
        if response.status() != 200 {
            return Err(response.status().as_u16());
        }
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Ok(Stream {
            response,
            seen: String::new(),
        })
    }

    /// The `change` events that arrive within `wait` (their data), keep-alives skipped.
    async fn changes(&mut self, wait: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(Ok(Some(chunk))) =
            tokio::time::timeout_at(deadline, self.response.chunk()).await
        {
            self.seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        let events: Vec<String> = self
            .seen
            .split("\n\n")
            .filter(|e| e.contains("event: change"))
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(str::to_owned)
            .collect();
        // Keep an unfinished event for the next call.
        self.seen = self.seen.rsplit("\n\n").next().unwrap_or("").to_owned();
        events
    }

    /// What the stream says until it has been quiet for 1.5 s (at most `wait`), each kind
    /// once: one change can reach a snapshot in two steps (a request, then the scheduler's
    /// reason for its wait), which a loaded machine may put in two different seconds.
    async fn settled(&mut self, wait: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut all = Vec::new();
        loop {
            let got = self.changes(Duration::from_millis(1500)).await;
            let quiet = got.is_empty();
            all.extend(got);
            if (quiet && !all.is_empty()) || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        all.sort();
        all.dedup();
        all
    }
}

async fn a_stream_tells_its_team_what_moved_and_nothing_of_other_teams(db: Db) {
    let a = AdminClient::new(db).await;
    let base = a.app.base.clone();
    assert_eq!(Stream::open(&base, None).await.err(), Some(401));
    assert_eq!(
        Stream::open(&base, Some("tsk_not_a_token")).await.err(),
        Some(401)
    );

    let (mine, theirs) = (team(&a, "evmine").await, team(&a, "evtheirs").await);
    for t in [&mine, &theirs] {
        set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    }
    let mut member = Stream::open(&base, Some(&mine.member))
        .await
        .expect("member");
    let mut outsider = Stream::open(&base, Some(&theirs.member))
        .await
        .expect("outsider");
    let admin_token = a.token().await;
    let mut admin = Stream::open(&base, Some(&admin_token))
        .await
        .expect("admin");
    // Nothing moved yet.
    assert!(member.changes(Duration::from_millis(1500)).await.is_empty());

    // The team admin requests a slice (no node: it queues): the member hears of it.
    let (s, v) = request(&a.app, &mine.team_admin, &mine.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let heard = member.settled(Duration::from_secs(8)).await;
    assert_eq!(heard, ["work"], "the member's stream");
    assert_eq!(admin.settled(Duration::from_secs(8)).await, ["work"]);
    // ... and the other team's member hears nothing of it.
    assert!(
        outsider
            .changes(Duration::from_millis(100))
            .await
            .is_empty()
    );

    // The other team's request: their member and the admin hear of it, ours does not.
    let (s, v) = request(&a.app, &theirs.member, &theirs.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(outsider.settled(Duration::from_secs(8)).await, ["work"]);
    assert_eq!(admin.settled(Duration::from_secs(8)).await, ["work"]);
    assert!(member.changes(Duration::from_millis(100)).await.is_empty());
}
