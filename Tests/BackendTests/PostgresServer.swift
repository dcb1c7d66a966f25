import Foundation
import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// The store a test's backend runs on: the suites that take `StoreKind.allCases` run every case
/// against both (the store parity suite).
enum StoreKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// A real PostgreSQL 15 server for tests: `initdb` and `pg_ctl` in a temporary directory,
/// listening only on a Unix socket in that directory (no TCP), trust authentication for role
/// `pylon`, durability off (tests do not survive power loss). PostgreSQL refuses to run as root,
/// so under root its binaries run as `nobody` (`setpriv`), which owns the directory. Stopped with
/// `pg_ctl stop -m immediate` (SIGQUIT: Foundation's children have SIGTERM blocked).
///
/// `shared` is started once per test process and stopped at exit; each test takes a fresh
/// database on it (`createDatabase`, a cheap `CREATE DATABASE` from `template1`).
final class PostgresServer {
    static let binDir = "/usr/lib/postgresql/15/bin"
    /// The socket's "port" (its file name) unless the server also listens on TCP.
    static let port = 5432
    let dir: String
    /// The server's port: its Unix socket's name, and its TCP port on 127.0.0.1 with `tcpPort`.
    let port: Int
    /// Listens on 127.0.0.1 too (`init(tcpPort:)`): a test can filter its packets.
    let tcp: Bool
    private(set) var running = false

    /// The server every parity test uses, started on first use.
    nonisolated(unsafe) private static var sharedServer: PostgresServer?
    private static let sharedLock = NSLock()
    static func shared() throws -> PostgresServer {
        sharedLock.lock()
        defer { sharedLock.unlock() }
        if let s = sharedServer { return s }
        PostgresServer.stopAbandoned()
        let s = try PostgresServer()
        sharedServer = s
        atexit { PostgresServer.sharedServer?.shutdown() }
        return s
    }

    /// `durable`: commits survive a server crash (`synchronous_commit = on`; off for the shared
    /// server, whose tests never crash it).
    /// `tcpPort`: also listen on 127.0.0.1 at that port.
    init(durable: Bool = false, tcpPort: Int? = nil) throws {
        port = tcpPort ?? PostgresServer.port
        tcp = tcpPort != nil
        // /tmp directly: a Unix socket path is limited to 107 bytes.
        var template = Array("/tmp/pylon-pg-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { throw TestFailure(description: "mkdtemp failed") }
        dir = String(cString: p)
        if getuid() == 0 {
            guard let pw = getpwnam("nobody") else { throw TestFailure(description: "no user nobody") }
            chown(dir, pw.pointee.pw_uid, pw.pointee.pw_gid)
        }
        chmod(dir, 0o700)
        try run(
            "initdb",
            ["-D", dir + "/data", "-U", "pylon", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        let conf = """
            listen_addresses = '\(tcp ? "127.0.0.1" : "")'
            unix_socket_directories = '\(dir)'
            port = \(port)
            fsync = off
            synchronous_commit = \(durable ? "on" : "off")
            full_page_writes = off
            max_connections = 50
            shared_buffers = 16MB
            """
        let confPath = dir + "/data/postgresql.conf"
        let existing = (try? String(contentsOfFile: confPath, encoding: .utf8)) ?? ""
        try (existing + "\n" + conf + "\n").write(toFile: confPath, atomically: false, encoding: .utf8)
        try "\(getpid())\n".write(toFile: dir + "/owner.pid", atomically: true, encoding: .utf8)
        try start()
    }

    /// Stops and removes the servers of earlier test processes that died without stopping them
    /// (killed by a timeout, say): each directory names its owner in `owner.pid`.
    static func stopAbandoned() {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []
        for e in entries where e.hasPrefix("pylon-pg-") {
            let d = "/tmp/" + e
            guard let text = try? String(contentsOfFile: d + "/owner.pid", encoding: .utf8),
                let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), pid != getpid(),
                kill(pid, 0) != 0 && errno == ESRCH
            else { continue }
            let abandoned = PostgresServer(adopting: d)
            abandoned.shutdown()
        }
    }

    /// An existing server directory (to stop it).
    private init(adopting dir: String) {
        self.dir = dir
        port = PostgresServer.port
        tcp = false
        running = FileManager.default.fileExists(atPath: dir + "/data/postmaster.pid")
    }

    /// `pg_ctl start -w`: returns once the server accepts connections.
    func start() throws {
        try run("pg_ctl", ["-D", dir + "/data", "-l", dir + "/server.log", "-w", "-t", "60", "start"])
        running = true
    }

    /// `pg_ctl stop -m immediate` (what a crash looks like to clients).
    func stop() {
        guard running else { return }
        try? run("pg_ctl", ["-D", dir + "/data", "-m", "immediate", "-w", "stop"])
        running = false
    }

    /// Runs a PostgreSQL binary (as `nobody` under root) to completion; throws unless it exits 0.
    /// Spawned and reaped here (`posix_spawn`, `waitpid`), not with Foundation's `Process`, whose
    /// exit detection waits for descriptors the daemonised postmaster keeps; the child gets an
    /// empty signal mask, its output goes to `dir/<tool>.out`.
    private func run(_ tool: String, _ args: [String]) throws {
        let path = PostgresServer.binDir + "/" + tool
        let argv = getuid() == 0 ? ["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", path] + args : [path] + args
        let out = dir + "/" + tool + ".out"
        let fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw TestFailure(description: "cannot create \(out)") }
        defer { close(fd) }
        if getuid() == 0, let pw = getpwnam("nobody") { fchown(fd, pw.pointee.pw_uid, pw.pointee.pw_gid) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, fd, 1)
        posix_spawn_file_actions_adddup2(&actions, fd, 2)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attr, &empty)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK))
        let cargs = argv.map { strdup($0) } + [nil]
        defer { for a in cargs { free(a) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, argv[0], &actions, &attr, cargs, environ)
        guard rc == 0 else { throw TestFailure(description: "cannot spawn \(tool): \(rc)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        guard status == 0 else {
            let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
            throw TestFailure(description: "\(tool) \(args.joined(separator: " ")) failed (\(status)): \(text)")
        }
    }

    /// The connection string of database `name` (over the socket in `dir`, or TCP with `tcp`).
    func url(_ name: String) -> String {
        tcp ? "postgresql://pylon@127.0.0.1:\(port)/\(name)" : "postgresql://pylon@/\(name)?host=\(dir)&port=\(port)"
    }

    /// A new empty database; its connection string.
    func createDatabase() throws -> String {
        let name = "t" + System.randomHex(6)
        try admin("CREATE DATABASE \(name)")
        return url(name)
    }

    /// Runs `sql` on database `postgres`.
    func admin(_ sql: String) throws {
        let e = try PostgresEngine(url: url("postgres"), statementTimeoutMs: 60_000)
        defer { e.close() }
        try e.exec(sql)
    }

    /// A `Store` on database `url` (for store-level tests).
    func store(_ url: String) throws -> Store { try Store(postgres: url) }

    /// Stops the server and removes its directory.
    func shutdown() {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }

    deinit { shutdown() }
}

extension StoreKind {
    /// The `--db` arguments for a new, empty store of this kind (`dir`: where a SQLite file
    /// would go; nil keeps SQLite in memory).
    func databaseArguments(sqliteFile: String? = nil) throws -> [String] {
        switch self {
        case .sqlite: return sqliteFile.map { ["--db", $0] } ?? []
        case .postgres: return ["--db", try PostgresServer.shared().createDatabase()]
        }
    }
}
