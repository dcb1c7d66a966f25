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
    /// The socket's "port" (its file name; there is no TCP listener).
    static let port = 5432
    let dir: String
    private(set) var running = false

    /// The server every parity test uses, started on first use.
    nonisolated(unsafe) private static var sharedServer: PostgresServer?
    static func shared() throws -> PostgresServer {
        if let s = sharedServer { return s }
        let s = try PostgresServer()
        sharedServer = s
        atexit { PostgresServer.sharedServer?.stop() }
        return s
    }

    init() throws {
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
            listen_addresses = ''
            unix_socket_directories = '\(dir)'
            port = \(PostgresServer.port)
            fsync = off
            synchronous_commit = off
            full_page_writes = off
            max_connections = 50
            shared_buffers = 16MB
            """
        let confPath = dir + "/data/postgresql.conf"
        let existing = (try? String(contentsOfFile: confPath, encoding: .utf8)) ?? ""
        try (existing + "\n" + conf + "\n").write(toFile: confPath, atomically: false, encoding: .utf8)
        try start()
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
    private func run(_ tool: String, _ args: [String]) throws {
        let p = Process()
        if getuid() == 0 {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            p.arguments = ["--reuid=nobody", "--regid=nogroup", "--clear-groups", PostgresServer.binDir + "/" + tool] + args
        } else {
            p.executableURL = URL(fileURLWithPath: PostgresServer.binDir + "/" + tool)
            p.arguments = args
        }
        p.currentDirectoryURL = URL(fileURLWithPath: dir)
        let out = dir + "/" + tool + ".out"
        if getuid() == 0, let pw = getpwnam("nobody") {
            _ = FileManager.default.createFile(atPath: out, contents: nil)
            chown(out, pw.pointee.pw_uid, pw.pointee.pw_gid)
        } else {
            _ = FileManager.default.createFile(atPath: out, contents: nil)
        }
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: out))
        defer { try? h.close() }
        p.standardOutput = h
        p.standardError = h
        p.standardInput = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
            throw TestFailure(description: "\(tool) \(args.joined(separator: " ")) exited \(p.terminationStatus): \(text)")
        }
    }

    /// The connection string of database `name` (over the socket in `dir`).
    func url(_ name: String) -> String { "postgresql://pylon@/\(name)?host=\(dir)&port=\(PostgresServer.port)" }

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

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }
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
