import PylonCore

/// Command-line configuration of `pylon-backend`.
package struct Options {
    package var host = "127.0.0.1"
    package var port: UInt16 = 8780
    /// SQLite database path; `:memory:` keeps everything in memory for the life of the process.
    /// A `postgresql://` (or `postgres://`) connection string uses PostgreSQL instead.
    package var dbPath = ":memory:"
    /// `--db-timeout-ms`: PostgreSQL's `statement_timeout` for every statement.
    package var dbTimeoutMs = StoreLimits.defaultStatementTimeoutMs
    package var maxBody = Limits.defaultMaxBody
    package var maxConnections = Limits.defaultMaxConnections
    package var maxOutputBytes = Limits.defaultMaxOutputBytes
    package var timeouts = Timeouts()
    package var logLevel = Log.Level.info
    /// The MQTT broker push sends are published to (`--mqtt HOST:PORT`); none by default.
    package var mqtt: (host: String, port: UInt16)?
    /// `--mqtt-username` / `--mqtt-password-file`: the backend's broker login.
    package var mqttUsername: String?
    package var mqttPasswordFile: String?
    /// `--mqtt-dynsec`: the broker runs mosquitto's dynamic-security plugin with this login as
    /// its admin; registering a device creates its broker client and role.
    package var mqttDynsec = false
    /// `--operator-token-file`: the admin and inspection endpoints' bearer token (0600 file).
    package var operatorTokenFile: String?
    /// `--enrol-secret-file`: the enrolment secret devices register with (0600 file), also
    /// accepted as a fleet-level device key on ingest, MA and container fetches.
    package var enrolSecretFile: String?
    /// `--open-enrolment`: anyone may register a new device (no enrolment secret).
    package var openEnrolment = false
    /// `--enable-fault-injection`: serve `/v1/faults` (tests); 404 otherwise.
    package var faultInjection = false

    package static let usage = """
        usage: pylon-backend [--listen HOST:PORT] [--db PATH | --db postgresql://...] [--db-timeout-ms MS]
                             [--max-body BYTES] [--max-connections N]
                             [--max-output-bytes N]
                             [--idle-timeout-ms MS] [--header-timeout-ms MS] [--body-timeout-ms MS]
                             [--log-level LEVEL] [--mqtt HOST:PORT] [--mqtt-username USER]
                             [--mqtt-password-file PATH] [--mqtt-dynsec]
                             [--operator-token-file PATH] [--enrol-secret-file PATH | --open-enrolment]
                             [--enable-fault-injection]

          --listen HOST:PORT  address to listen on (default 127.0.0.1:8780; port 0 picks a free port;
                              IPv6 as [::1]:PORT)
          --db PATH           SQLite database (default :memory:, i.e. nothing survives a restart)
          --db postgresql://[USER[:PASSWORD]@][HOST][:PORT]/DBNAME[?PARAM=VALUE...]
                              shared state on PostgreSQL (libpq connection URI; several
                              instances may use one database; see docs/FLEET.md). Prefer a
                              password in PGPASSFILE (or ~/.pgpass) to one in the URI
          --db-timeout-ms MS  PostgreSQL statement_timeout: a statement running longer is
                              cancelled and its request answered 503 (default 5000)
          --max-body BYTES    largest request body, as sent and after gunzip (default 1048576)
          --max-connections N open connections; at the limit the least recently active one that
                              is not answering is closed to make room (default 1024)
          --max-output-bytes N  response bytes waiting for slow or non-reading clients, all
                              connections together; beyond it a response over 64 KiB is
                              answered 503 server_busy, Retry-After: 1 (default 67108864)
          --idle-timeout-ms MS    close a connection idle between requests (default 120000)
          --header-timeout-ms MS  408 when a request head is not complete this long after its
                                  first byte (default 20000)
          --body-timeout-ms MS    408 when a request body is not complete this long after its
                                  head (default 60000)
          --log-level LEVEL   debug, info, warn or error (default info)
          --mqtt HOST:PORT    MQTT broker for the push API (MQTT 5, QoS 1); without it push sends
                              answer 503
          --mqtt-username USER, --mqtt-password-file PATH
                              the backend's broker login (password file mode 0600)
          --mqtt-dynsec       the broker runs mosquitto's dynamic-security plugin and USER is its
                              admin: registering a device creates its broker client (username =
                              device id, password = device token, fixed client id) and a role
                              limited to the device's own topics
          --operator-token-file PATH
                              the operator token (a 0600 file): /v1/admin/*, /v1/inspect/* and
                              /v1/faults need "Authorization: Bearer <token>"; without this
                              option they answer 403
          --enrol-secret-file PATH
                              the enrolment secret (a 0600 file) POST /v1/devices/register needs;
                              also accepted as the fleet-level device key on ingest, MA and
                              container fetches
          --open-enrolment    anyone may register a new device (no secret; see docs/SECURITY.md)
          --enable-fault-injection
                              serve /v1/faults (tests only; 404 without it)

        Prints "pylon-backend listening on HOST:PORT" on stdout once it accepts connections.
        """

    package struct UsageError: Error, CustomStringConvertible { package let description: String }

    /// Parses `arguments` (without the program name). `--help` is reported as a `UsageError`
    /// with an empty description.
    package static func parse(_ arguments: [String]) throws(UsageError) -> Options {
        var o = Options()
        var it = arguments.makeIterator()
        while let a = it.next() {
            func value() throws(UsageError) -> String {
                guard let v = it.next() else { throw UsageError(description: "\(a) needs a value") }
                return v
            }
            switch a {
            case "--listen":
                let v = try value()
                guard let (h, p) = splitHostPort(v) else {
                    throw UsageError(description: "--listen expects HOST:PORT, got \(v)")
                }
                o.host = h
                o.port = p
            case "--db":
                o.dbPath = try value()
            case "--db-timeout-ms":
                o.dbTimeoutMs = try positive(try value(), a)
            case "--max-body":
                o.maxBody = try positive(try value(), a)
            case "--max-connections":
                o.maxConnections = try positive(try value(), a)
            case "--max-output-bytes":
                o.maxOutputBytes = try positive(try value(), a)
            case "--idle-timeout-ms":
                o.timeouts.idleMs = UInt64(try positive(try value(), a))
            case "--header-timeout-ms":
                o.timeouts.headerMs = UInt64(try positive(try value(), a))
            case "--body-timeout-ms":
                o.timeouts.bodyMs = UInt64(try positive(try value(), a))
            case "--log-level":
                let v = try value()
                guard let l = Log.Level(name: v) else { throw UsageError(description: "unknown log level \(v)") }
                o.logLevel = l
            case "--mqtt":
                let v = try value()
                guard let hp = splitHostPort(v) else { throw UsageError(description: "--mqtt expects HOST:PORT, got \(v)") }
                o.mqtt = hp
            case "--mqtt-username": o.mqttUsername = try value()
            case "--mqtt-password-file": o.mqttPasswordFile = try value()
            case "--mqtt-dynsec": o.mqttDynsec = true
            case "--operator-token-file": o.operatorTokenFile = try value()
            case "--enrol-secret-file": o.enrolSecretFile = try value()
            case "--open-enrolment": o.openEnrolment = true
            case "--enable-fault-injection": o.faultInjection = true
            case "-h", "--help":
                throw UsageError(description: "")
            default:
                throw UsageError(description: "unknown argument \(a)")
            }
        }
        if o.openEnrolment && o.enrolSecretFile != nil {
            throw UsageError(description: "--open-enrolment and --enrol-secret-file exclude each other")
        }
        if o.mqttDynsec && (o.mqtt == nil || o.mqttUsername == nil) {
            throw UsageError(description: "--mqtt-dynsec needs --mqtt and --mqtt-username")
        }
        return o
    }

    private static func positive(_ v: String, _ flag: String) throws(UsageError) -> Int {
        guard let n = Int(v), n > 0 else { throw UsageError(description: "\(flag) expects a positive integer") }
        return n
    }

    /// Splits `HOST:PORT` or `[V6HOST]:PORT`; `localhost` means 127.0.0.1.
    static func splitHostPort(_ s: String) -> (String, UInt16)? {
        guard let colon = s.lastIndex(of: ":"), let port = UInt16(s[s.index(after: colon)...]) else { return nil }
        var host = String(s[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host == "localhost" { host = "127.0.0.1" }
        guard !host.isEmpty else { return nil }
        return (host, port)
    }
}
