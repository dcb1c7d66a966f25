import PylonCore
import PylonMQTT

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
    /// Most batches committed in one transaction (`IngestLane`; 1: one transaction a batch).
    package var ingestGroup = IngestLane.defaultMaxGroup
    package var maxOutputBytes = Limits.defaultMaxOutputBytes
    package var timeouts = Timeouts()
    package var logLevel = Log.Level.info
    /// The MQTT broker push sends are published to (`--mqtt HOST:PORT[,HOST:PORT...]`, the nodes
    /// of a broker cluster, tried in order); none by default.
    package var mqtt: [MQTTOptions.Broker] = []
    /// `--mqtt-protocol 3.1.1|5|auto` (default auto: MQTT 5, 3.1.1 when the broker refuses 5).
    package var mqttProtocol = "auto"
    /// `--mqtt-nats-auth PATH`: the broker cluster is nats-server with JWT auth; PATH (0600,
    /// written by `tools/pylon-nats-auth init`) holds the account and its signing key, with
    /// which each registered device gets its own user JWT as its broker password.
    package var mqttNatsAuth: String?
    /// `--mqtt-username` / `--mqtt-password-file`: the backend's broker login.
    package var mqttUsername: String?
    package var mqttPasswordFile: String?
    /// `--mqtt-dynsec`: the broker runs mosquitto's dynamic-security plugin with this login as
    /// its admin; registering a device creates its broker client and role.
    package var mqttDynsec = false
    /// `--mqtt-auth-key-file PATH`: the broker runs the `pylon_auth` plugin; PATH (0600,
    /// `<kid>:<hex key>`) signs each device's broker password (`MQTTAuth.swift`).
    package var mqttAuthKeyFile: String?
    /// `--operator-token-file`: the admin and inspection endpoints' bearer token (0600 file);
    /// operator sessions (`Backend+Session.swift`) are the other way in.
    package var operatorTokenFile: String?
    /// `--enrol-secret-file`: the enrolment secret devices register with (0600 file), also
    /// accepted as a fleet-level device key on ingest, MA and container fetches.
    package var enrolSecretFile: String?
    /// `--open-enrolment`: anyone may register a new device (no enrolment secret).
    package var openEnrolment = false
    /// `--enable-fault-injection`: serve `/v1/faults` (tests); 404 otherwise.
    package var faultInjection = false
    /// NATS mode (`--nats URL[,URL…]` and the other `--nats-*` flags): batches are published to
    /// JetStream; nil keeps them in the database.
    package var nats: NATSSettings?
    /// `--nats-password-file`: read by `main` into `nats.password`.
    package var natsPasswordFile: String?
    /// The console's options (`Options+Console.swift`).
    package var console = ConsoleOptions()
    /// `--max-sse-clients`: live tails (`GET /v1/admin/events/tail`) open at once.
    package var maxSSEClients = TailLimits.defaultMaxClients
    /// `--erase-user APPKEY:EUID`: erase that user (`Backend+Erasure.swift`), print the result, exit.
    package var eraseUser: String?

    package static let usage = """
        usage: pylon-backend [--listen HOST:PORT] [--db PATH | --db postgresql://...] [--db-timeout-ms MS]
                             [--max-body BYTES] [--max-connections N] [--ingest-group N]
                             [--max-output-bytes N] [--max-sse-clients N] [--erase-user APPKEY:EUID]
                             [--idle-timeout-ms MS] [--header-timeout-ms MS] [--body-timeout-ms MS]
                             [--log-level LEVEL] [--mqtt HOST:PORT[,HOST:PORT...]] [--mqtt-username USER]
                             [--mqtt-password-file PATH] [--mqtt-dynsec | --mqtt-nats-auth PATH | --mqtt-auth-key-file PATH]
                             [--mqtt-protocol 3.1.1|5|auto]
                             [--operator-token-file PATH] [--enrol-secret-file PATH | --open-enrolment]
                             [--enable-fault-injection] [--console-dir DIR] [--session-idle-ms MS]
                             [--session-max-ms MS] [--cookie-secure] [--enable-reset]
                             [--metrics-token-file PATH]
                             [--add-operator NAME --role viewer|admin --password-file PATH]
                             [--nats URL[,URL...] [--nats-user USER --nats-password-file PATH |
                              --nats-creds PATH] [--nats-stream NAME] [--nats-subject-prefix P]
                              [--nats-replicas N] [--nats-duplicate-window-ms MS]
                              [--nats-max-age-s S] [--nats-max-bytes N]
                              [--nats-ack-timeout-ms MS] [--nats-max-pending N]]

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
          --ingest-group N    most batches stored in one transaction (group commit; 1: a
                              transaction a batch; default 64)
          --max-output-bytes N  response bytes waiting for slow or non-reading clients, all
                              connections together; beyond it a response over 64 KiB is
                              answered 503 server_busy, Retry-After: 1 (default 67108864)
          --idle-timeout-ms MS    close a connection idle between requests (default 120000)
          --header-timeout-ms MS  408 when a request head is not complete this long after its
                                  first byte (default 20000)
          --body-timeout-ms MS    408 when a request body is not complete this long after its
                                  head (default 60000)
          --max-sse-clients N live tails (GET /v1/admin/events/tail) open at once; beyond it
                              503 server_busy (default 32)
          --erase-user APPKEY:EUID
                              erase that user (events, profile, identities, contacts, push
                              bindings; docs/SECURITY.md "Erasure"), print the request's record
                              as JSON and exit: 0 done, 3 pending (stream deletes wait for a
                              backend running with --nats), 1 failed, 2 invalid
          --log-level LEVEL   debug, info, warn or error (default info)
          --mqtt HOST:PORT[,HOST:PORT...]
                              MQTT broker for the push API (QoS 1); several addresses are the
                              nodes of a cluster, tried in turn after a failed connect or a loss;
                              without it push sends answer 503
          --mqtt-protocol 3.1.1|5|auto
                              MQTT version spoken to the broker (default auto: 5, and 3.1.1 once
                              a broker refuses 5, as nats-server and RabbitMQ do)
          --mqtt-username USER, --mqtt-password-file PATH
                              the backend's broker login (password file mode 0600)
          --mqtt-dynsec       the broker runs mosquitto's dynamic-security plugin and USER is its
                              admin: registering a device creates its broker client (username =
                              device id, password = device token, fixed client id) and a role
                              limited to the device's own topics
          --mqtt-nats-auth PATH
                              the broker is a nats-server cluster with JWT auth (docs/FLEET.md):
                              PATH (0600, from tools/pylon-nats-auth init) holds the account's
                              signing key; registering a device mints its user JWT (name = device
                              id, its own topics only, MQTT only), returned as its broker password
          --mqtt-auth-key-file PATH
                              the broker (mosquitto) runs tools/mosquitto-auth's pylon_auth plugin:
                              PATH (0600, <kid>:<hex key>) signs each device's broker password
                              (username = device id, its client id, 30 days) and the backend's
                              own login (USER, default pylon-backend) when no password file is given
          --operator-token-file PATH
                              the operator token (a 0600 file): /v1/admin/*, /v1/inspect/* and
                              /v1/faults need "Authorization: Bearer <token>" or an operator
                              session (--add-operator); without either they answer 403
          --enrol-secret-file PATH
                              the enrolment secret (a 0600 file) POST /v1/devices/register needs;
                              also accepted as the fleet-level device key on ingest, MA and
                              container fetches
          --open-enrolment    anyone may register a new device (no secret; see docs/SECURITY.md)
          --enable-fault-injection
                              serve /v1/faults (tests only; 404 without it)

        \(ConsoleOptions.usage)

        Ingest into NATS JetStream (docs/FLEET.md "Ingest stream (JetStream)"):
          --nats URL[,URL...] nats://HOST:PORT of one or more servers (comma-separated; the
                              connection fails over and reconnects through all of them). Each
                              accepted batch is published to JetStream, Nats-Msg-Id = its
                              Idempotency-Key, and answered only once JetStream acknowledged it;
                              the database keeps the keys (long-span dedup) and counters, not
                              records. Without --nats batches are stored in --db as before
          --nats-user USER, --nats-password-file PATH
                              NATS login (password file mode 0600)
          --nats-creds PATH   a NATS .creds file (user JWT and seed) instead
          --nats-stream NAME  the JetStream stream (default PYLON_INGEST), created if absent
          --nats-subject-prefix P
                              a batch of stream S is published on P.S (default pylon.ingest;
                              bytes of S other than A-Z a-z 0-9 - _ as %HH); the stream takes P.>
          --nats-replicas N   stream replicas when creating it (default 1; 3 on a 3-node cluster)
          --nats-duplicate-window-ms MS
                              the stream's duplicate window (default 120000)
          --nats-max-age-s S  messages older than this are removed (default 604800; 0 = never)
          --nats-max-bytes N  the stream's size bound, oldest removed first (default: none)
          --nats-ack-timeout-ms MS
                              no acknowledgement this long after the publish: 503
                              stream_unavailable, Retry-After: 1 (default 5000)
          --nats-max-pending N
                              publishes waiting for acknowledgements; beyond: 503 server_busy,
                              Retry-After: 1 (default 4096)
          Until connected and the stream exists, and while the connection is lost, ingest
          answers 503 stream_unavailable, Retry-After: 1.

        Prints "pylon-backend listening on HOST:PORT" on stdout once it accepts connections.
        """

    package struct UsageError: Error, CustomStringConvertible { package let description: String }

    /// Parses `arguments` (without the program name). `--help` is reported as a `UsageError`
    /// with an empty description.
    /// The `--nats-*` values while parsing (`nats` once `--nats` is known to be given).
    private var natsSettings = NATSSettings()

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
            case "--ingest-group":
                o.ingestGroup = try positive(try value(), a)
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
                let list = v.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
                guard list.count <= MQTTOptions.maxBrokers else {
                    throw UsageError(description: "--mqtt takes at most \(MQTTOptions.maxBrokers) addresses")
                }
                o.mqtt = []
                for a in list {
                    guard let hp = splitHostPort(a) else { throw UsageError(description: "--mqtt expects HOST:PORT, got \(a)") }
                    o.mqtt.append(MQTTOptions.Broker(host: hp.0, port: Int32(hp.1)))
                }
            case "--mqtt-protocol":
                let v = try value()
                guard ["3.1.1", "5", "auto"].contains(v) else { throw UsageError(description: "--mqtt-protocol is 3.1.1, 5 or auto") }
                o.mqttProtocol = v
            case "--mqtt-nats-auth": o.mqttNatsAuth = try value()
            case "--mqtt-username": o.mqttUsername = try value()
            case "--mqtt-password-file": o.mqttPasswordFile = try value()
            case "--mqtt-dynsec": o.mqttDynsec = true
            case "--mqtt-auth-key-file": o.mqttAuthKeyFile = try value()
            case "--operator-token-file": o.operatorTokenFile = try value()
            case "--enrol-secret-file": o.enrolSecretFile = try value()
            case "--open-enrolment": o.openEnrolment = true
            case "--enable-fault-injection": o.faultInjection = true
            case "--nats":
                let v = try value()
                let urls = v.split(separator: ",").map { String($0).trimmingSpaces }
                for u in urls where !(u.hasPrefix("nats://") || u.hasPrefix("tls://")) || u.count <= 7 {
                    throw UsageError(description: "--nats expects nats://HOST:PORT[,nats://HOST:PORT...], got \(u)")
                }
                guard !urls.isEmpty else { throw UsageError(description: "--nats needs at least one URL") }
                o.natsSettings.urls = urls
            case "--nats-user": o.natsSettings.user = try value()
            case "--nats-password-file": o.natsPasswordFile = try value()
            case "--nats-creds": o.natsSettings.credsFile = try value()
            case "--nats-stream":
                let v = try value()
                if let why = JetStreamWire.invalidStreamName(v) { throw UsageError(description: "--nats-stream: \(why)") }
                o.natsSettings.stream.name = v
            case "--nats-subject-prefix":
                let v = try value()
                if let why = JetStreamWire.invalidPrefix(v) { throw UsageError(description: "--nats-subject-prefix: \(why)") }
                o.natsSettings.stream.subjectPrefix = v
            case "--nats-replicas":
                let n = try positive(try value(), a)
                guard n <= 5 else { throw UsageError(description: "--nats-replicas is 1...5 (JetStream's limit)") }
                o.natsSettings.stream.replicas = n
            case "--nats-duplicate-window-ms": o.natsSettings.stream.duplicateWindowMs = try positive(try value(), a)
            case "--nats-max-age-s":
                let v = try value()
                guard let n = Int(v), n >= 0 else { throw UsageError(description: "--nats-max-age-s expects a non-negative integer") }
                o.natsSettings.stream.maxAgeS = n
            case "--nats-max-bytes": o.natsSettings.stream.maxBytes = Int64(try positive(try value(), a))
            case "--nats-ack-timeout-ms": o.natsSettings.ackTimeoutMs = UInt64(try positive(try value(), a))
            case "--nats-max-pending": o.natsSettings.maxPending = try positive(try value(), a)
            case "--max-sse-clients": o.maxSSEClients = try positive(try value(), a)
            case "--erase-user": o.eraseUser = try value()
            case "-h", "--help":
                throw UsageError(description: "")
            default:
                guard try o.console.parse(a, value) else { throw UsageError(description: "unknown argument \(a)") }
            }
        }
        if o.openEnrolment && o.enrolSecretFile != nil {
            throw UsageError(description: "--open-enrolment and --enrol-secret-file exclude each other")
        }
        if o.mqttDynsec && (o.mqtt.isEmpty || o.mqttUsername == nil) {
            throw UsageError(description: "--mqtt-dynsec needs --mqtt and --mqtt-username")
        }
        if o.mqttNatsAuth != nil && (o.mqtt.isEmpty || o.mqttDynsec) {
            throw UsageError(description: "--mqtt-nats-auth needs --mqtt and excludes --mqtt-dynsec")
        }
        if o.mqttAuthKeyFile != nil && (o.mqtt.isEmpty || o.mqttDynsec || o.mqttNatsAuth != nil) {
            throw UsageError(description: "--mqtt-auth-key-file needs --mqtt and excludes --mqtt-dynsec and --mqtt-nats-auth")
        }
        if o.natsSettings.urls.isEmpty {
            if o.natsSettings != NATSSettings() || o.natsPasswordFile != nil {
                throw UsageError(description: "the --nats-* options need --nats")
            }
        } else {
            let s = o.natsSettings
            if s.credsFile != nil && (s.user != nil || o.natsPasswordFile != nil) {
                throw UsageError(description: "--nats-creds and --nats-user/--nats-password-file exclude each other")
            }
            if (s.user == nil) != (o.natsPasswordFile == nil) {
                throw UsageError(description: "--nats-user and --nats-password-file go together")
            }
            o.natsSettings.stream.maxMessageBytes = o.maxBody + Limits.natsHeaderAllowance
            o.nats = o.natsSettings
        }
        try o.console.validate()
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

extension String {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}
