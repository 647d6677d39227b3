//! The pages and JSON a viewer reads: the overview, one dependency, the dead letters, the
//! replays, the worker registry and the audit trail. Each handler takes a [`Viewer`].

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Json, Response};
use fleet_budget::control::{AuditEntry, audit};
use maud::Markup;
use serde::{Deserialize, Serialize};

use super::error::ConsoleError;
use super::extract::Viewer;
use super::{dependency, redis};
use crate::App;
use crate::access::lock;
use crate::dead_letters::{Group, Sort, Which};
use crate::filters::{FilterForm, some};
use crate::pages::{self, AuditPage};

/// The overview's query: the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct OverviewQuery {
    #[serde(default)]
    page: Option<String>,
}

/// One page of the overview, from the console's last reading of the fleet.
async fn overview_page_of(
    app: &App,
    q: &OverviewQuery,
) -> Result<pages::OverviewPage, ConsoleError> {
    let ov = app.overview().await?;
    let sparks = lock(&app.sparks).clone();
    Ok(pages::OverviewPage::new(
        ov,
        q.page.as_deref(),
        &lock(&app.history),
        app.settings.history_every,
        sparks.as_deref(),
    ))
}

pub(super) async fn overview_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<OverviewQuery>,
) -> Result<Markup, ConsoleError> {
    let shown = overview_page_of(&app, &q).await?;
    let dead = app.sample(Which::Dead);
    let parked = app.sample(Which::Parked);
    Ok(pages::overview(&visitor, &shown, [&dead, &parked]))
}

/// The overview's rows, pager and workers' line, rendered as on the page: what its live
/// refresh swaps in.
pub(super) async fn overview_fragment(
    State(app): State<Arc<App>>,
    _: Viewer,
    Query(q): Query<OverviewQuery>,
) -> Result<Markup, ConsoleError> {
    let shown = overview_page_of(&app, &q).await?;
    Ok(pages::overview_fragment(&shown))
}

/// A page of the last reading as JSON, serialized once per reading
/// ([`crate::fleet::Overview::json`]).
pub(super) async fn overview_json(
    State(app): State<Arc<App>>,
    _: Viewer,
    Query(q): Query<OverviewQuery>,
) -> Result<Response, ConsoleError> {
    let ov = app.overview().await?;
    let body = ov.json(fleet_budget::clock::now_ms(), q.page.as_deref());
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

/// One dependency's page: its row of the console's last reading of the fleet (what the overview
/// shows, no Redis call), or, for a dependency that reading did not have (new since, or none),
/// a reading of it alone; its history; its last 20 audit entries (one Redis call).
pub(super) async fn dependency_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Path(name): Path<String>,
) -> Result<Markup, ConsoleError> {
    let dep = dependency(&name)?;
    let ov = app.overview().await?;
    let name_shown = pages::t(dep.as_str());
    let row = ov
        .dependencies
        .iter()
        .find(|r| r.dependency == name_shown)
        .cloned();
    let unusable = ov
        .unusable
        .iter()
        .find(|u| u.dependency == name_shown)
        .map(|u| u.error.clone());
    let shown = if row.is_some() || unusable.is_some() {
        pages::Shown {
            row,
            unusable,
            read_at_ms: ov.read_at_ms,
            read_every: Some(app.settings.history_every),
        }
    } else {
        let alone = redis(
            &app,
            crate::fleet::overview(&app.settings.config.budget, &app.store, Some(&dep)),
        )
        .await?;
        pages::Shown {
            row: alone.dependencies.into_iter().next(),
            unusable: alone.unusable.into_iter().next().map(|u| u.error),
            read_at_ms: alone.read_at_ms,
            read_every: None,
        }
    };
    let kept = {
        let kept = lock(&app.history);
        let now_ms = shown.row.as_ref().map_or(0, |r| r.now_ms);
        pages::Kept {
            history: kept.of(&name_shown),
            hour: kept.hour_of(&name_shown),
            shadow: kept.shadow_hour(&name_shown, now_ms),
        }
    };
    let trail = trail_of(&app, dep.as_str(), None, 20).await?;
    let searched = (!trail.reached_start && trail.entries.len() < 20).then_some(trail.searched);
    Ok(pages::dependency(
        &visitor,
        &dep,
        &shown,
        &kept,
        &trail.entries,
        searched,
    ))
}

/// Audit entries a dependency's page or its audit page reads at most per view, newest first,
/// looking for that dependency's: the trail keeps up to 10,000 (each with its before and after
/// states), and reading all of it for one dependency's few cost 500–700 ms a view (debug
/// build, docs/BENCHMARKS.md). A page that stops short says so and links to older entries.
const TRAIL_SEARCHED: usize = 1_000;
/// Entries read per round trip while searching.
const TRAIL_READ: usize = 250;

/// What [`trail_of`] found.
struct TrailRead {
    /// The dependency's entries, newest first.
    entries: Vec<AuditEntry>,
    /// Entries of the whole trail looked through.
    searched: usize,
    /// Whether the search reached the trail's oldest entry.
    reached_start: bool,
    /// The id of the oldest entry looked through.
    oldest: Option<String>,
}

/// The newest `want` audit entries of `dependency` with ids up to `before` (inclusive; `None`:
/// the newest), looking through at most [`TRAIL_SEARCHED`] entries of the trail, newest first,
/// [`TRAIL_READ`] a round trip.
async fn trail_of(
    app: &App,
    dependency: &str,
    before: Option<(u64, u64)>,
    want: usize,
) -> Result<TrailRead, ConsoleError> {
    let mut found = TrailRead {
        entries: Vec::new(),
        searched: 0,
        reached_start: false,
        oldest: None,
    };
    // The oldest entry looked at: the next read is of older ones.
    let mut bound: Option<(u64, u64)> = None;
    while found.searched < TRAIL_SEARCHED && found.entries.len() < want {
        let read = redis(
            app,
            app.audit.read(
                &app.store,
                None,
                bound.or(before).map(|(ms, _)| ms),
                None,
                TRAIL_READ,
            ),
        )
        .await?;
        let full = read.len() >= TRAIL_READ;
        let mut fresh: Vec<AuditEntry> = read
            .into_iter()
            .rev()
            .filter(|e| bound.is_none_or(|b| stream_id(&e.id).is_some_and(|id| id < b)))
            .filter(|e| before.is_none_or(|b| stream_id(&e.id).is_some_and(|id| id <= b)))
            .collect();
        // Never past the bound, though a read may hold more: the page says how far it looked.
        let cut = fresh.len() > TRAIL_SEARCHED - found.searched;
        fresh.truncate(TRAIL_SEARCHED - found.searched);
        let Some(oldest) = fresh.last() else {
            // Nothing older: the start; or a full read of one millisecond's entries, all seen.
            found.reached_start = !full;
            break;
        };
        bound = stream_id(&oldest.id);
        found.oldest = Some(oldest.id.clone());
        found.searched += fresh.len();
        let room = want - found.entries.len();
        found.entries.extend(
            fresh
                .into_iter()
                .filter(|e| e.dependency.as_deref() == Some(dependency))
                .take(room),
        );
        if !full && !cut {
            found.reached_start = true;
            break;
        }
    }
    Ok(found)
}

/// A list's query: the filters (with `g`, a group's short key), the page and the sort.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(flatten)]
    filter: FilterForm,
    #[serde(default)]
    page: Option<String>,
    #[serde(default)]
    sort: Option<String>,
}

pub(super) async fn dead_letters_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<ListQuery>,
) -> Result<Markup, ConsoleError> {
    let filter = q.filter.filter().map_err(ConsoleError::BadRequest)?;
    let which = q.filter.which();
    let sort = Sort::parse(q.sort.as_deref());
    let sample = app.sample(which);
    let groups = sample.index_groups(&filter, sort);
    let (offset, page) = pages::page_of(q.page.as_deref(), groups.len());
    let shown: Vec<Group> = groups
        .iter()
        .skip(offset)
        .take(pages::PER_PAGE)
        .cloned()
        .collect();
    Ok(pages::dead_letters(
        &visitor,
        which,
        &q.filter,
        sort,
        page,
        &sample,
        &shown,
        groups.len(),
        app.settings.dead_letter_sample,
    ))
}

pub(super) async fn group_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<ListQuery>,
) -> Result<Markup, ConsoleError> {
    let which = q.filter.which();
    let sample = app.sample(which);
    // The group by its key (links carry it), or by its fields (older links, typed addresses).
    let group = match some(q.filter.g.as_ref()) {
        Some(key) => {
            let filter = q.filter.filter().map_err(ConsoleError::BadRequest)?;
            sample.group_by_key(&filter, key).ok_or_else(|| {
                ConsoleError::NotFound(
                    "no such group in the queue's index now (replayed or purged since?)".to_owned(),
                )
            })?
        }
        None => Group {
            dependency: q.filter.dependency.clone().unwrap_or_default(),
            reason: q.filter.reason.clone().unwrap_or_default(),
            error_class: q.filter.error_class.clone().unwrap_or_default(),
            count: 0,
            oldest_ms: None,
        },
    };
    let form = FilterForm {
        g: None,
        dependency: Some(group.dependency.clone()).filter(|d| !d.is_empty()),
        reason: Some(group.reason.clone())
            .filter(|r| fleet_budget::DeadLetterReason::parse(r).is_some()),
        error_class: None,
        ..q.filter.clone()
    };
    let filter = form.filter().map_err(ConsoleError::BadRequest)?;
    let group = if q.filter.g.is_none() {
        let counted = sample.group_by_key(&filter, &group.key());
        counted.unwrap_or(group)
    } else {
        group
    };
    let sort = Sort::parse(q.sort.as_deref());
    let (_, total) = sample.members(&filter, &group.error_class, sort, 0, 0);
    let (offset, page) = pages::page_of(q.page.as_deref(), total);
    let (members, total) =
        sample.members(&filter, &group.error_class, sort, offset, pages::PER_PAGE);
    Ok(pages::group(
        &visitor, which, &q.filter, &group, sort, page, &sample, &members, total,
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct MessageQuery {
    #[serde(default)]
    queue: Option<String>,
    id: String,
}

pub(super) async fn message_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<MessageQuery>,
) -> Result<Markup, ConsoleError> {
    let which = Which::parse(q.queue.as_deref());
    let sample = app.sample(which);
    let Some((message, detail)) = sample.message(&q.id) else {
        return Err(ConsoleError::NotFound(
            "no such message in the last sample (it may have been replayed, or not sampled)"
                .to_owned(),
        ));
    };
    Ok(pages::message(
        &visitor,
        which,
        sample.taken_ms,
        message,
        detail,
    ))
}

pub(super) async fn replays_page(State(app): State<Arc<App>>, Viewer(visitor): Viewer) -> Markup {
    pages::replays(&visitor, &app.jobs.list().await)
}

pub(super) async fn replay_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Path(id): Path<String>,
) -> Result<Markup, ConsoleError> {
    let job = app
        .jobs
        .lookup(&id)
        .await
        .ok_or_else(|| ConsoleError::NotFound("no such replay".to_owned()))?;
    Ok(pages::replay(&visitor, &job))
}

pub(super) async fn replay_json(
    State(app): State<Arc<App>>,
    _: Viewer,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let mut job = app
        .jobs
        .lookup(&id)
        .await
        .ok_or_else(|| ConsoleError::NotFound("no such replay".to_owned()))?;
    // The run's fields, and the words its page shows for them (one wording, the server's).
    // Its texts through the one door for outside text, as on its page.
    job.selected = pages::t(&job.selected);
    job.actor = pages::t(&job.actor);
    job.error = job.error.as_deref().map(pages::t);
    job.message_id = job.message_id.as_deref().map(pages::t);
    let mut body = serde_json::to_value(&job).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        // Held to `docs/schemas/console/replay.schema.json`.
        o.insert("schema_version".to_owned(), 1.into());
        o.insert("state".to_owned(), job.state().into());
        o.insert("held_text".to_owned(), pages::held_text(&job).into());
        o.insert("rate_text".to_owned(), pages::rate_text(&job).into());
    }
    Ok(Json(body).into_response())
}

/// The audit page's query: a dependency, and the page (the id of its newest entry).
#[derive(Debug, Default, Deserialize)]
pub(super) struct AuditQuery {
    #[serde(default)]
    dependency: Option<String>,
    #[serde(default)]
    before: Option<String>,
}

/// A stream id (`ms-seq`) as a pair that orders as the stream does.
fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

pub(super) async fn audit_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<AuditQuery>,
) -> Result<Markup, ConsoleError> {
    let dependency = some(q.dependency.as_ref()).map(str::to_owned);
    if let Some(d) = &dependency {
        super::dependency(d)?;
    }
    let before = match some(q.before.as_ref()) {
        Some(b) => Some(stream_id(b).ok_or_else(|| {
            ConsoleError::BadRequest("`before` is an entry's id (MS-SEQ)".to_owned())
        })?),
        None => None,
    };
    let per = pages::PER_PAGE;
    let (entries, older) = match &dependency {
        // One dependency's: looked for through at most `TRAIL_SEARCHED` entries of the trail;
        // when the search stops short, the next page starts where it stopped.
        Some(d) => {
            let mut found = trail_of(&app, d, before, per + 1).await?;
            let older = if found.entries.len() > per {
                found.entries.pop().map(|e| e.id)
            } else if found.reached_start {
                None
            } else {
                // `before` is inclusive and the oldest entry looked at may be one shown here.
                found.oldest.as_deref().and_then(audit::id_before)
            };
            (found.entries, older)
        }
        None => {
            // The page's entries and one more (is there an older page?), and room for the
            // entries of the cursor's own millisecond that were shown already.
            let read = redis(
                &app,
                app.audit
                    .read(&app.store, None, before.map(|(ms, _)| ms), None, per + 64),
            )
            .await?;
            let mut entries: Vec<AuditEntry> = read
                .into_iter()
                .rev()
                .filter(|e| before.is_none_or(|b| stream_id(&e.id).is_some_and(|id| id <= b)))
                .take(per + 1)
                .collect();
            let older = if entries.len() > per {
                entries.pop().map(|e| e.id)
            } else {
                None
            };
            (entries, older)
        }
    };
    Ok(pages::audit(
        &visitor,
        &AuditPage {
            entries,
            dependency,
            older,
            paged: before.is_some(),
        },
    ))
}

/// The workers' page's and JSON's query: the page (1-based, `pages::PER_PAGE` entries a page;
/// past the last, the last).
#[derive(Debug, Default, Deserialize)]
pub(super) struct WorkersQuery {
    #[serde(default)]
    page: Option<String>,
}

/// The registry of the console's last reading, or why it could not be read.
fn registry_of(
    ov: &crate::fleet::Overview,
) -> Result<
    (
        Arc<fleet_budget::control::FleetWorkers>,
        crate::fleet::WorkersLine,
    ),
    ConsoleError,
> {
    match (&ov.registry, ov.workers) {
        (Some(registry), Some(line)) => Ok((Arc::clone(registry), line)),
        _ => Err(ConsoleError::upstream(
            "Redis",
            &ov.workers_error
                .clone()
                .unwrap_or_else(|| "the worker registry was not read".to_owned()),
        )),
    }
}

pub(super) async fn workers_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<WorkersQuery>,
) -> Result<Markup, ConsoleError> {
    let ov = app.overview().await?;
    let (registry, line) = registry_of(&ov)?;
    let (from, page) = pages::page_of(q.page.as_deref(), registry.workers.len());
    Ok(pages::workers(
        &visitor,
        &pages::WorkersPage {
            registry: &registry,
            line,
            page,
            from,
            read_at_ms: ov.read_at_ms,
        },
    ))
}

/// `/api/workers`: a page of the registry as the console's last reading read it
/// (`docs/schemas/console/workers.schema.json`).
#[derive(Debug, Serialize)]
struct WorkersJson<'a> {
    schema_version: u32,
    /// Server ms of the registry's read.
    now_ms: u64,
    /// When the console's reading ended, and how old it is (the console's clock, ms).
    read_at_ms: u64,
    read_age_ms: u64,
    /// Ids in the registry, whether entries past those read were left out, and the counts of
    /// those read.
    total: u64,
    truncated: bool,
    counts: crate::fleet::WorkersLine,
    /// Entries read (at most 10,000), and how they are ordered.
    listed: usize,
    order: &'static str,
    /// This page (1-based), how many there are, and entries a page.
    page: usize,
    pages: usize,
    per_page: usize,
    /// The page's entries.
    workers: &'a [fleet_budget::control::WorkerEntry],
}

pub(super) async fn workers_json(
    State(app): State<Arc<App>>,
    _: Viewer,
    Query(q): Query<WorkersQuery>,
) -> Result<Response, ConsoleError> {
    let ov = app.overview().await?;
    let (registry, counts) = registry_of(&ov)?;
    let listed = registry.workers.len();
    let (from, page) = pages::page_of(q.page.as_deref(), listed);
    let per_page = pages::PER_PAGE;
    let body = WorkersJson {
        schema_version: 2,
        now_ms: registry.now_ms,
        read_at_ms: ov.read_at_ms,
        read_age_ms: fleet_budget::clock::now_ms().saturating_sub(ov.read_at_ms),
        total: registry.total,
        truncated: registry.truncated,
        counts,
        listed,
        order: "worst first: in fallback, unreadable, silent, then reporting; each last seen first",
        page,
        pages: listed.div_ceil(per_page).max(1),
        per_page,
        workers: registry
            .workers
            .get(from..(from + per_page).min(listed))
            .unwrap_or_default(),
    };
    Ok(Json(body).into_response())
}
