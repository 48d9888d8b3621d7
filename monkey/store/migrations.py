"""Forward migrations of monkey.db, registered by name and applied in order."""

from __future__ import annotations

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        """
        CREATE TABLE IF NOT EXISTS migrations(name TEXT PRIMARY KEY, applied_at REAL NOT NULL);
        CREATE TABLE day_counters(day TEXT PRIMARY KEY, n INTEGER NOT NULL);
        CREATE TABLE jobs(
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            juid TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            state TEXT NOT NULL,
            argv TEXT NOT NULL,
            provider TEXT NOT NULL,
            resources TEXT NOT NULL,
            env TEXT NOT NULL,
            snapshot TEXT,
            workdir TEXT NOT NULL,
            datasets TEXT NOT NULL,
            git TEXT NOT NULL,
            python TEXT NOT NULL,
            retries INTEGER NOT NULL DEFAULT 0,
            attempts INTEGER NOT NULL DEFAULT 0,
            request TEXT,
            exit_code INTEGER,
            reason TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            not_before REAL NOT NULL DEFAULT 0,
            sweep TEXT,
            params TEXT NOT NULL DEFAULT '{}',
            instance TEXT,
            secrets TEXT
        );
        CREATE INDEX jobs_state ON jobs(state, seq);
        CREATE INDEX jobs_request ON jobs(request) WHERE request IS NOT NULL;
        CREATE TABLE attempts(
            juid TEXT NOT NULL,
            n INTEGER NOT NULL,
            instance TEXT NOT NULL,
            state TEXT NOT NULL,
            started_at REAL,
            ended_at REAL,
            exit_code INTEGER,
            signal INTEGER,
            reason TEXT,
            pid INTEGER,
            run_dir TEXT NOT NULL,
            heartbeat_at REAL,
            events_offset INTEGER NOT NULL DEFAULT 0,
            gpus TEXT NOT NULL DEFAULT '',
            cpu REAL,
            rss INTEGER,
            PRIMARY KEY (juid, n)
        );
        CREATE UNIQUE INDEX attempts_one_live ON attempts(juid) WHERE state = 'live';
        CREATE TABLE instances(
            id TEXT PRIMARY KEY,
            provider TEXT NOT NULL,
            kind TEXT NOT NULL,
            host TEXT NOT NULL,
            state TEXT NOT NULL,
            extra TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE events(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            juid TEXT NOT NULL,
            attempt INTEGER,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            old TEXT,
            new TEXT,
            detail TEXT
        );
        CREATE INDEX events_juid ON events(juid, id);
        CREATE TABLE blobs(digest TEXT PRIMARY KEY, size INTEGER NOT NULL, created_at REAL NOT NULL);
        CREATE TABLE stat_cache(
            path TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            ino INTEGER NOT NULL,
            digest TEXT NOT NULL
        );
        """,
    ),
    (
        "0002_tracking",
        """
        CREATE TABLE metric_series(
            id INTEGER PRIMARY KEY,
            juid TEXT NOT NULL,
            name TEXT NOT NULL,
            UNIQUE (juid, name)
        );
        CREATE TABLE metrics(
            series INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            step INTEGER,
            value REAL,
            wall REAL NOT NULL
        );
        CREATE INDEX metrics_series ON metrics(series);
        CREATE TABLE run_summary(
            juid TEXT NOT NULL,
            name TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (juid, name)
        );
        CREATE TABLE sweeps(
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            state TEXT NOT NULL,
            spec TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX jobs_sweep ON jobs(sweep, seq) WHERE sweep IS NOT NULL;
        CREATE TABLE job_packages(juid TEXT PRIMARY KEY, digest TEXT NOT NULL);
        """,
    ),
    (
        "0003_jobspec",
        """
        CREATE TABLE job_specs(juid TEXT PRIMARY KEY, spec TEXT NOT NULL);
        """,
    ),
    (
        "0004_ssh",
        """
        CREATE TABLE job_outputs(juid TEXT PRIMARY KEY, globs TEXT NOT NULL);
        """,
    ),
    (
        "0005_instances",
        """
        ALTER TABLE instances ADD COLUMN name TEXT NOT NULL DEFAULT '';
        ALTER TABLE instances ADD COLUMN address TEXT;
        ALTER TABLE instances ADD COLUMN size TEXT;
        ALTER TABLE instances ADD COLUMN spot INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE instances ADD COLUMN launched_at REAL;
        ALTER TABLE instances ADD COLUMN terminated_at REAL;
        ALTER TABLE instances ADD COLUMN reach TEXT NOT NULL DEFAULT '';
        ALTER TABLE instances ADD COLUMN idle_since REAL;
        ALTER TABLE instances ADD COLUMN price REAL;
        UPDATE instances SET reach = state,
            state = CASE state WHEN 'up' THEN 'running' ELSE 'unknown' END;
        CREATE TABLE instance_events(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            instance TEXT NOT NULL,
            ts REAL NOT NULL,
            old TEXT,
            new TEXT,
            detail TEXT
        );
        CREATE INDEX instance_events_instance ON instance_events(instance);
        CREATE TABLE provider_status(
            provider TEXT PRIMARY KEY,
            error TEXT NOT NULL,
            since REAL NOT NULL
        );
        """,
    ),
    (
        "0006_rerun",
        """
        CREATE TABLE job_reruns(
            juid TEXT PRIMARY KEY,
            rerun_of TEXT NOT NULL,
            changes TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX job_reruns_of ON job_reruns(rerun_of);
        """,
    ),
    (
        "0007_queue_index",
        # The core asks for the next back-off's end on every pass: without it, a scan of
        # every queued job (10% of the core's time with 1,000 queued).
        """
        CREATE INDEX jobs_queued ON jobs(not_before) WHERE state = 'queued';
        """,
    ),
    (
        "0008_cost",
        """
        ALTER TABLE attempts ADD COLUMN size TEXT;
        ALTER TABLE attempts ADD COLUMN spot INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE attempts ADD COLUMN price REAL;
        """,
    ),
    (
        "0009_spot",
        """
        ALTER TABLE jobs ADD COLUMN front INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        "0010_dash_updated",
        # The dashboard asks every second for the jobs changed lately: without it, a scan
        # of every job (18 ms of CPU a second with 2,000 jobs; most of its idle cost).
        """
        CREATE INDEX jobs_updated ON jobs(updated_at);
        """,
    ),
    (
        "0011_ready_index",
        # ready_jobs' order (preempted first, then oldest): without it every dispatch sorted
        # all queued jobs (a 100,000-cell sweep: each pass sorts 100,000 rows).
        """
        CREATE INDEX jobs_ready ON jobs(state, front DESC, seq);
        """,
    ),
    (
        "0012_host_chores",
        # What `rm`, `gc` and `du --hosts` ask of SSH hosts, owed until the core reaches
        # each host (what: run = a deleted job's folder, gc = blobs no job needs, du = a
        # measure); and what each host held when last measured. No `juid` column: rm's
        # deletion of a job's rows must not take its owed clean-up with them.
        """
        CREATE TABLE host_chores(
            id INTEGER PRIMARY KEY,
            provider TEXT NOT NULL,
            instance TEXT NOT NULL,
            what TEXT NOT NULL,
            job TEXT,
            grace REAL,
            created_at REAL NOT NULL
        );
        CREATE TABLE host_usage(
            instance TEXT PRIMARY KEY,
            provider TEXT NOT NULL,
            usage TEXT NOT NULL,
            measured_at REAL NOT NULL
        );
        """,
    ),
    (
        "0013_instance_requests",
        # `monkey create|delete instance`: written by the CLI, carried out by the core.
        """
        CREATE TABLE instance_requests(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            action TEXT NOT NULL,
            provider TEXT NOT NULL,
            instance TEXT,
            size TEXT,
            spot INTEGER,
            force INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL,
            detail TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX instance_requests_open ON instance_requests(state)
            WHERE state IN ('pending', 'working');
        """,
    ),
    (
        "0014_unreachable",
        # Since when the instance of the job's live attempt has been out of reach (NULL:
        # reached, or no live attempt): the attempt is `running`, shown `unreachable`, and
        # lost once that lasts the provider's lost_after. An attempt lost that way is
        # `adrift` until its instance, reached again, says how it ended.
        """
        ALTER TABLE jobs ADD COLUMN unreachable_since REAL;
        ALTER TABLE attempts ADD COLUMN adrift INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX attempts_adrift ON attempts(instance) WHERE adrift = 1;
        """,
    ),
    (
        "0015_blob_stamps",
        # The blob file's stat (mtime, ctime, inode; its size is `size`) when a process last
        # hashed its bytes and found them right, and when that was recorded (ns): a core
        # that sees the same stat, recorded well after that ctime, need not hash it again.
        """
        ALTER TABLE blobs ADD COLUMN mtime_ns INTEGER;
        ALTER TABLE blobs ADD COLUMN ctime_ns INTEGER;
        ALTER TABLE blobs ADD COLUMN ino INTEGER;
        ALTER TABLE blobs ADD COLUMN checked_ns INTEGER;
        """,
    ),
    (
        "0016_users",
        # `monkey server`: its users, each token kept only as its SHA-256 digest; and who
        # submitted each job (NULL: a job from before owners were recorded).
        """
        CREATE TABLE users(
            name TEXT PRIMARY KEY,
            digest TEXT NOT NULL UNIQUE,
            admin INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            last_used REAL
        );
        ALTER TABLE jobs ADD COLUMN owner TEXT;
        """,
    ),
    (
        "0017_event_actors",
        # Who acted (a user of `monkey server`, or this machine's user; NULL: the core, or an
        # event from before actors were recorded); `list jobs --mine/--owner` by owner.
        """
        ALTER TABLE events ADD COLUMN actor TEXT;
        CREATE INDEX jobs_owner ON jobs(owner, seq);
        """,
    ),
    (
        "0018_dependencies",
        # `run --after JOB` (ANY = 0: JOB must succeed) and `--after-any JOB` (ANY = 1: JOB
        # must end): the job stays queued until each DEP is so.
        """
        CREATE TABLE job_deps(
            juid TEXT NOT NULL,
            dep TEXT NOT NULL,
            any INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (juid, dep)
        ) WITHOUT ROWID;
        CREATE INDEX job_deps_dep ON job_deps(dep);
        """,
    ),
    (
        "0019_priority",
        # `run --priority N`: higher first among queued jobs (preempted ones still lead),
        # FIFO within a priority; per owner too, for the fair share of a shared server.
        """
        ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
        DROP INDEX jobs_ready;
        CREATE INDEX jobs_ready ON jobs(state, front DESC, priority DESC, seq);
        CREATE INDEX jobs_owner_ready ON jobs(state, owner, front DESC, priority DESC, seq);
        """,
    ),
    (
        "0020_quotas",
        # `monkey server quota`: per user (or '*', everyone) and provider (or '*', all) the
        # most concurrent jobs, GPUs and estimated $/hour of live attempts (NULL: not set by
        # this entry; -1: unlimited); and why a queued job waits for a quota (NULL: it does not).
        """
        CREATE TABLE quotas(
            user TEXT NOT NULL,
            provider TEXT NOT NULL,
            jobs INTEGER,
            gpus INTEGER,
            spend REAL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (user, provider)
        ) WITHOUT ROWID;
        ALTER TABLE jobs ADD COLUMN held TEXT;
        CREATE INDEX jobs_held ON jobs(provider) WHERE held IS NOT NULL;
        """,
    ),
    (
        "0021_quota_shares",
        # A user's fair-share weight on a provider (`server quota set --share W`; NULL: not
        # set by this entry, 1 when no entry sets it): free slots go to the owner whose
        # running slots divided by their share are the fewest.
        """
        ALTER TABLE quotas ADD COLUMN share REAL;
        """,
    ),
    (
        "0022_notify",
        # `monkey notify`: each user's targets (their URLs, passwords and keys live in a
        # 0600 file of MONKEY_HOME/secrets named by SECRET, never here); the targets a job
        # was submitted with (`run --notify`); the outbox (events worth a message, written
        # with the event itself: see Store._event); and the deliveries made of it, each with
        # its idempotency id, sent in order per target with retries (its job is `job`, not
        # `juid`: `rm` of the job leaves its messages to be sent).
        """
        CREATE TABLE notify_targets(
            owner TEXT NOT NULL,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            shown TEXT NOT NULL,
            options TEXT NOT NULL,
            events TEXT NOT NULL,
            sweep TEXT,
            glob TEXT,
            secret TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (owner, name)
        ) WITHOUT ROWID;
        CREATE TABLE job_notify(
            juid TEXT NOT NULL,
            target TEXT NOT NULL,
            events TEXT NOT NULL,
            PRIMARY KEY (juid, target)
        ) WITHOUT ROWID;
        CREATE TABLE notify_outbox(event INTEGER PRIMARY KEY);
        CREATE TABLE notify_deliveries(
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            owner TEXT NOT NULL,
            target TEXT NOT NULL,
            job TEXT,
            what TEXT NOT NULL,
            body TEXT NOT NULL,
            created_at REAL NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            tries INTEGER NOT NULL DEFAULT 0,
            next_try REAL NOT NULL DEFAULT 0,
            last_error TEXT,
            sent_at REAL
        );
        CREATE INDEX notify_pending ON notify_deliveries(state, owner, target, seq);
        CREATE INDEX notify_job ON notify_deliveries(job);
        """,
    ),
    (
        "0023_walk_memo",
        # What the ignore files of each project folder decided in its last snapshot
        # (snapshot.walk.WalkMemo, JSON): the next one parses none that did not change.
        """
        CREATE TABLE walk_memo(root TEXT PRIMARY KEY, memo TEXT NOT NULL) WITHOUT ROWID;
        """,
    ),
    (
        "0024_ownership",
        # Issue 41: the address ranges an admin lets plain users' notify targets reach
        # (`server notify-allow CIDR`); a user's storage limit in bytes (`server quota set
        # USER --storage SIZE`, on the entry for all providers); and who uploaded each blob
        # to a main node, when (an upload counts against its uploader for the gc grace).
        """
        CREATE TABLE notify_allow(cidr TEXT PRIMARY KEY, added_at REAL NOT NULL) WITHOUT ROWID;
        ALTER TABLE quotas ADD COLUMN storage INTEGER;
        CREATE TABLE blob_uploads(
            user TEXT NOT NULL,
            digest TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (user, digest)
        ) WITHOUT ROWID;
        CREATE INDEX blob_uploads_digest ON blob_uploads(digest);
        """,
    ),
    (
        "0025_job_images",
        # Issue 44: the OCI image a job runs in, pinned at submission: {"ref", "digest"};
        # and what a running job's attempt is doing before its command ("pulling 12 MB of
        # 45 MB"), from its heartbeats.
        """
        CREATE TABLE job_images(juid TEXT PRIMARY KEY, image TEXT NOT NULL) WITHOUT ROWID;
        ALTER TABLE jobs ADD COLUMN phase TEXT;
        """,
    ),
    (
        "0026_notes_tags",
        # Issue 43: a researcher's note and tags on a job or a sweep (`monkey job note|tag`,
        # `monkey sweep note|tag`, Monkey Web); a job's go with it (their `juid` column), a
        # sweep's with its last job (Store.delete_jobs).
        """
        CREATE TABLE job_notes(
            juid TEXT PRIMARY KEY, note TEXT NOT NULL, at REAL NOT NULL, by TEXT
        ) WITHOUT ROWID;
        CREATE TABLE job_tags(juid TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (juid, tag))
            WITHOUT ROWID;
        CREATE INDEX job_tags_tag ON job_tags(tag);
        CREATE TABLE sweep_notes(
            sweep TEXT PRIMARY KEY, note TEXT NOT NULL, at REAL NOT NULL, by TEXT
        ) WITHOUT ROWID;
        CREATE TABLE sweep_tags(sweep TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (sweep, tag))
            WITHOUT ROWID;
        CREATE INDEX sweep_tags_tag ON sweep_tags(tag);
        """,
    ),
]

SCHEMA_VERSION = len(MIGRATIONS)
