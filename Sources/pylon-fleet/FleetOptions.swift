/// Command-line configuration of `pylon-fleet`, and its named limits.
struct FleetOptions: Equatable {
    /// Upper bounds of the options (a value above is refused with a usage error).
    enum Limits {
        static let maxDevices = 200_000
        static let maxRatePerDevice = 1000.0
        static let maxBatchRecords = 10_000
        static let maxInflightHTTP = 4096
        static let maxDurationS = 86_400
        /// Other processes of one run a process follows (`--peer-status-file`).
        static let maxPeers = 64
        /// Descriptors kept back from the device count for HTTP, the loop and stdio.
        static let fdReserve = 64
        /// Push messages remembered per device to drop redeliveries (oldest forgotten first).
        static let maxSeenPerDevice = 4096
        /// Events a device holds while its batches cannot be delivered; past it new ones are
        /// not generated and are counted as `throttled` (the uploader's disk queue stands in
        /// for this on a real device).
        static let maxPendingEventsPerDevice: Int64 = 100_000
    }

    struct Broker: Equatable {
        var host: String
        var port: Int32
    }

    var devices = 100
    /// The global index of this process's first device (`--first-device`): with several
    /// simulator processes (tools/fleet/fleet.py) each simulates `devices` devices from here, so
    /// install ids, users and record ids stay disjoint.
    var firstDevice = 0
    /// This process's name in the process table of the summary (`--name`).
    var processName = "pylon-fleet"
    var ratePerDevice = 1.0
    var durationS = 60
    var backend = "http://127.0.0.1:8780"
    var brokers = [Broker(host: "127.0.0.1", port: 1883)]
    /// Seconds between device-targeted and user-targeted sends (0: none).
    var pushEveryS = 5.0
    /// Seconds between broadcasts (0: none).
    var broadcastEveryS = 30.0
    var json = false
    /// Devices started per second (registration, binding, MQTT connect).
    var rampPerSecond = 200.0
    /// How often a device posts what it has, and how many waiting events make it post at once:
    /// the uploader's defaults (`intervalMs` 10,000, `maxCount` 50, docs/UPLOADER.md), so K
    /// simulated devices send the backend the requests K real ones would.
    var batchIntervalMs: Int64 = 10_000
    var maxBatchRecords = 50
    /// Requests in flight to the backend at once; the rest wait in order.
    var maxInflightHTTP = 256
    var progressS = 5.0
    /// After the load: how long to wait for unacknowledged batches and push deliveries.
    var drainTimeoutS = 60
    var operatorTokenFile: String?
    var enrolSecretFile: String?
    /// `NAME PID` lines (re-read at every progress line): the servers whose CPU and RSS are shown.
    var watchFile: String?
    /// Written every second: `{"phase", "elapsedMs", "devices", "connected", "everConnected"}`
    /// (the fleet script waits for every device before it injects faults).
    var statusFile: String?
    /// `--peer-status-file PATH` (repeatable): the status files of the run's other processes;
    /// their broadcasts are expected on this process's devices too, and its drain waits for them.
    var peerStatusFiles: [String] = []
    var appKey = "fleet"
    var appId = "fleet.app"
    var devicesPerUser = 2
    var keepaliveS: Int32 = 30
    /// The broadcast topic every device subscribes to at QoS 0 (pylon-push's); the registration
    /// answer's `mqtt.broadcastTopic` wins when it names one. Empty: none.
    var broadcastTopic = "pylon/push/all"
    var runId = ""
    /// Read the stream back at the end and compare with what was acknowledged.
    var verify = true
    /// `--verify-exec "PROGRAM ARG..."`: read the stream back from this program's stdout (one
    /// JSON object a line: a record `{"id"}` or a stream message `{"batch": {"records": [...]}}`,
    /// as tools/pylon-stream-consumer prints) instead of the backend's inspection API.
    var verifyExec: [String]?
    var gzip = true
    /// With several brokers: a device not connected this long moves to the next one.
    var brokerFailoverMs: Int64 = 5000

    var stream: String { "ma." + appKey }

    static let usage = """
        usage: pylon-fleet [--devices K] [--first-device I] [--name NAME] [--rate EVENTS_PER_S] [--duration S] [--backend URL]
                           [--broker HOST:PORT[,HOST:PORT...]] [--push-every S] [--broadcast-every S]
                           [--ramp DEVICES_PER_S] [--batch-interval-ms MS] [--max-batch N]
                           [--max-inflight N] [--progress S] [--drain-timeout S] [--devices-per-user N]
                           [--operator-token-file PATH] [--enrol-secret-file PATH] [--watch-file PATH]
                           [--status-file PATH] [--peer-status-file PATH...] [--app-key KEY] [--app-id ID] [--keepalive S]
                           [--broadcast-topic TOPIC|none] [--broker-failover-ms MS] [--run-id ID]
                           [--no-verify | --verify-exec CMD]
                           [--no-gzip] [--json]

        Simulates K devices on one libuv loop speaking the device protocols of pylon-backend and
        the push broker: device registration (enrolment secret), push registration and user
        binding, MA-format batches on stream ma.KEY at EVENTS_PER_S per device, a persistent MQTT
        session on the device topic with acknowledgements on the ack topic. Progress every
        --progress seconds on stderr; the summary on stdout (JSON with --json). Exit status 1 when
        an acknowledged event is lost or stored twice, a push reached an app twice or never.

          --devices K            simulated devices (default 100, at most 200000)
          --first-device I       global index of the first one (default 0): several processes
                                 of one run (same --run-id) simulate disjoint ranges, and each
                                 counts the broadcasts another one sends to its devices
          --name NAME            this process's name in the summary (default pylon-fleet)
          --rate N               events per second per device (default 1)
          --duration S           seconds of load after the ramp starts (default 60)
          --backend URL          the backend or its load balancer (default http://127.0.0.1:8780)
          --broker LIST          MQTT brokers HOST:PORT, comma-separated; device i starts on
                                 broker i mod n and moves to the next after a lost connection
          --push-every S         a device-targeted and a user-targeted send every S (default 5; 0 none)
          --broadcast-every S    a broadcast every S (default 30; 0 none)
          --ramp N               devices started per second (default 200)
          --batch-interval-ms MS how often a device posts its events (default 10000, the
                                 uploader's intervalMs)
          --max-batch N          records per batch at most; this many waiting are posted at
                                 once (default 50, the uploader's maxCount)
          --max-inflight N       backend requests in flight at once (default 256)
          --progress S           seconds between progress lines (default 5)
          --drain-timeout S      wait after the load for acknowledgements (default 60)
          --devices-per-user N   devices bound to each user (default 2)
          --operator-token-file PATH, --enrol-secret-file PATH
                                 the backend's operator token and enrolment secret (0600 files)
          --watch-file PATH      lines "NAME PID": processes whose CPU and RSS are reported
          --status-file PATH     written every second: phase, elapsedMs, devices, connected,
                                 the broadcasts sent and the sends not yet answered
          --peer-status-file PATH  another process of this run (repeatable): its broadcasts
                                 are expected here too and the drain waits for them
          --keepalive S          MQTT keepalive (default 30)
          --broadcast-topic T    the topic each device also reads at QoS 0 (default
                                 pylon/push/all, as pylon-push; none: only its own topic)
          --broker-failover-ms MS  with several brokers, a device not connected this long moves
                                 to the next one (default 5000)
          --no-verify            do not read the stream back at the end
          --verify-exec CMD      read it back from CMD's stdout (absolute path, space-separated
                                 arguments; JSON lines: records or JetStream messages)
          --json                 the summary as one JSON object
        """

    struct UsageError: Error, CustomStringConvertible { let description: String }

    static func parse(_ arguments: [String]) throws(UsageError) -> FleetOptions {
        var o = FleetOptions()
        var it = arguments.makeIterator()
        while let a = it.next() {
            func value() throws(UsageError) -> String {
                guard let v = it.next() else { throw UsageError(description: "\(a) needs a value") }
                return v
            }
            func int(_ range: ClosedRange<Int>) throws(UsageError) -> Int {
                let v = try value()
                guard let n = Int(v), range.contains(n) else {
                    throw UsageError(description: "\(a) expects an integer in \(range.lowerBound)...\(range.upperBound), got \(v)")
                }
                return n
            }
            func number(_ range: ClosedRange<Double>) throws(UsageError) -> Double {
                let v = try value()
                guard let n = Double(v), range.contains(n) else {
                    throw UsageError(description: "\(a) expects a number in \(range.lowerBound)...\(range.upperBound), got \(v)")
                }
                return n
            }
            switch a {
            case "--devices": o.devices = try int(1...Limits.maxDevices)
            case "--first-device": o.firstDevice = try int(0...Limits.maxDevices)
            case "--name":
                let v = try value()
                guard isName(v) else { throw UsageError(description: "--name must be 1 to 64 of [A-Za-z0-9_-]") }
                o.processName = v
            case "--rate": o.ratePerDevice = try number(0...Limits.maxRatePerDevice)
            case "--duration": o.durationS = try int(1...Limits.maxDurationS)
            case "--backend":
                let v = try value()
                guard v.hasPrefix("http://") || v.hasPrefix("https://") else {
                    throw UsageError(description: "--backend expects an http:// or https:// URL, got \(v)")
                }
                o.backend = v.hasSuffix("/") ? String(v.dropLast()) : v
            case "--broker": o.brokers = try parseBrokers(try value())
            case "--push-every": o.pushEveryS = try number(0...3600)
            case "--broadcast-every": o.broadcastEveryS = try number(0...3600)
            case "--ramp": o.rampPerSecond = try number(1...100_000)
            case "--batch-interval-ms": o.batchIntervalMs = Int64(try int(10...60_000))
            case "--max-batch": o.maxBatchRecords = try int(1...Limits.maxBatchRecords)
            case "--max-inflight": o.maxInflightHTTP = try int(1...Limits.maxInflightHTTP)
            case "--progress": o.progressS = try number(0.2...3600)
            case "--drain-timeout": o.drainTimeoutS = try int(0...3600)
            case "--devices-per-user": o.devicesPerUser = try int(1...1000)
            case "--operator-token-file": o.operatorTokenFile = try value()
            case "--enrol-secret-file": o.enrolSecretFile = try value()
            case "--watch-file": o.watchFile = try value()
            case "--status-file": o.statusFile = try value()
            case "--peer-status-file":
                guard o.peerStatusFiles.count < Limits.maxPeers else {
                    throw UsageError(description: "--peer-status-file: at most \(Limits.maxPeers) peers")
                }
                o.peerStatusFiles.append(try value())
            case "--app-key":
                let v = try value()
                guard isName(v) else { throw UsageError(description: "--app-key must be 1 to 64 of [A-Za-z0-9_-]") }
                o.appKey = v
            case "--app-id":
                let v = try value()
                guard isName(v) || v.contains(".") else { throw UsageError(description: "--app-id must be 1 to 64 of [A-Za-z0-9._-]") }
                o.appId = v
            case "--broadcast-topic":
                let v = try value()
                guard v == "none" || (1...256).contains(v.utf8.count) && !v.contains("#") && !v.contains("+") else {
                    throw UsageError(description: "--broadcast-topic expects a topic of 1 to 256 bytes without wildcards, or none")
                }
                o.broadcastTopic = v == "none" ? "" : v
            case "--keepalive": o.keepaliveS = Int32(try int(5...3600))
            case "--broker-failover-ms": o.brokerFailoverMs = Int64(try int(100...600_000))
            case "--run-id":
                let v = try value()
                guard isName(v) else { throw UsageError(description: "--run-id must be 1 to 64 of [A-Za-z0-9_-]") }
                o.runId = v
            case "--no-verify": o.verify = false
            case "--verify-exec":
                let v = try value().split(separator: " ").map(String.init)
                guard let first = v.first, first.hasPrefix("/") else {
                    throw UsageError(description: "--verify-exec expects an absolute program path and its arguments")
                }
                o.verifyExec = v
            case "--no-gzip": o.gzip = false
            case "--json": o.json = true
            case "-h", "--help": throw UsageError(description: "")
            default: throw UsageError(description: "unknown argument \(a)")
            }
        }
        guard o.firstDevice + o.devices <= Limits.maxDevices else {
            throw UsageError(description: "--first-device + --devices must be at most \(Limits.maxDevices)")
        }
        return o
    }

    /// `HOST:PORT[,HOST:PORT...]`.
    static func parseBrokers(_ s: String) throws(UsageError) -> [Broker] {
        var out: [Broker] = []
        for part in s.split(separator: ",") {
            guard let colon = part.lastIndex(of: ":"), let port = Int32(part[part.index(after: colon)...]), (1...65535).contains(port),
                colon > part.startIndex
            else { throw UsageError(description: "--broker expects HOST:PORT[,HOST:PORT...], got \(s)") }
            var host = String(part[..<colon])
            if host == "localhost" { host = "127.0.0.1" }
            out.append(Broker(host: host, port: port))
        }
        guard !out.isEmpty else { throw UsageError(description: "--broker needs at least one HOST:PORT") }
        return out
    }

    static func isName(_ s: String) -> Bool {
        (1...64).contains(s.utf8.count)
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x5F || c == 0x2D
            }
    }
}
