import PylonBackend
import PylonCore
import PylonMQTT

#if canImport(Glibc)
import Glibc
#endif

/// pylon-backend: the reference backend (HTTP/1.1 on loopback; see docs/backend-openapi.yaml).
let options: Options
if CommandLine.arguments.dropFirst().contains("--version") {
    print("pylon-backend 0.1.0")
    System.exit(0)
}
do throws(Options.UsageError) {
    options = try Options.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    if error.description.isEmpty {
        print(Options.usage)
        System.exit(0)
    }
    Log("backend").error("invalid arguments", ["error": error.description])
    Log.writeRaw(Options.usage + "\n")
    System.exit(2)
}
Log.minimum = options.logLevel
System.unblockAllSignals()
System.ignoreSIGPIPE()

let log = Log("backend")
let loop = Loop()
let store: Store
do {
    store = try Store.open(options.dbPath, statementTimeoutMs: options.dbTimeoutMs)
} catch {
    log.error("cannot open the database", ["db": Store.redacted(options.dbPath), "error": "\(error)"])
    System.exit(1)
}
if options.console.addOperator != nil {
    let status = Backend.addOperator(store, options.console, log: log)
    store.close()
    System.exit(status)
}
let backend = Backend(store: store, maxBody: options.maxBody)
backend.startIngestLane(loop: loop, maxGroup: options.ingestGroup)
store.reconnect(on: loop)
if let target = options.eraseUser {
    // `--erase-user APPKEY:EUID`: erase, print the request's record, exit (0 when done).
    let (code, text) = backend.eraseFromCommandLine(target)
    print(text)
    store.close()
    System.exit(code)
}
if let why = backend.startConsole(options.console, loop: loop) {
    log.error("cannot start the console", ["error": why])
    System.exit(1)
}
func secret(_ path: String?, _ what: String) -> [UInt8]? {
    guard let path else { return nil }
    switch SecretFile.read(path) {
    case .success(let s): return s
    case .failure(let e):
        log.error("cannot use the \(what) file", ["error": e.description])
        System.exit(1)
    }
}
backend.credentials.operatorToken = secret(options.operatorTokenFile, "operator token")
backend.credentials.enrolSecret = secret(options.enrolSecretFile, "enrolment secret")
backend.credentials.openEnrolment = options.openEnrolment
backend.faultsEnabled = options.faultInjection
backend.dynsec = options.mqttDynsec
if backend.credentials.operatorToken == nil {
    log.warn("no --operator-token-file: the admin and inspection endpoints answer 403")
}
if backend.credentials.enrolSecret == nil && !options.openEnrolment {
    log.warn("no --enrol-secret-file or --open-enrolment: devices cannot register")
}
if options.faultInjection { log.warn("fault injection enabled (/v1/faults): for tests only") }
if let path = options.mqttNatsAuth {
    switch NATSAuth.load(path) {
    case .success(let a): backend.natsAuth = a
    case .failure(let e):
        log.error("cannot use the --mqtt-nats-auth file", ["error": e.description])
        System.exit(1)
    }
}
if let path = options.mqttAuthKeyFile {
    switch MQTTAuth.load(path) {
    case .success(let a): backend.mqttAuth = a
    case .failure(let e):
        log.error("cannot use the --mqtt-auth-key-file file", ["error": e.description])
        System.exit(1)
    }
}
if !options.mqtt.isEmpty {
    var o = MQTTOptions(clientId: "pylon-backend-" + System.randomHex(4))
    o.brokers = options.mqtt
    o.cleanSession = true
    o.protocolVersion = options.mqttProtocol == "3.1.1" ? 4 : 5
    o.protocolFallback = options.mqttProtocol == "auto"
    o.keepaliveS = 30
    o.username = options.mqttUsername
    if let pw = secret(options.mqttPasswordFile, "broker password") { o.password = String(decoding: pw, as: UTF8.self) }
    if let auth = backend.mqttAuth, o.password == nil {
        // The pylon_auth plugin's backend user: a token of our own, for any client id.
        o.username = o.username ?? MQTTAuth.backendUser
        o.password = auth.backendToken(username: o.username!)
    }
    o.backoffInitialMs = 100
    o.backoffMaxMs = 5000
    backend.attachBroker(MQTTClient(loop: loop, options: o))
}
if var n = options.nats {
    if let pw = secret(options.natsPasswordFile, "NATS password") { n.password = String(decoding: pw, as: UTF8.self) }
    for attempt in 1...JetStreamPublisher.startAttempts {
        do throws(JetStreamPublisher.StartError) {
            backend.jetstream = try JetStreamPublisher(loop: loop, settings: n)
            break
        } catch {
            guard attempt < JetStreamPublisher.startAttempts else {
                log.error("cannot start the NATS client", ["error": error.description])
                System.exit(1)
            }
            log.warn("NATS client start failed; trying again", ["error": error.description, "attempt": "\(attempt)"])
            usleep(JetStreamPublisher.startRetryMs * 1000)  // start-up: the loop does not run yet
        }
    }
}
let server: Server
do {
    server = try Server(
        loop: loop, host: options.host, port: options.port, maxBody: options.maxBody,
        maxConnections: options.maxConnections, timeouts: options.timeouts, handler: backend.handle)
} catch {
    log.error("cannot listen", ["address": "\(options.host):\(options.port)", "error": error.description])
    System.exit(1)
}

server.outputBudget.limit = options.maxOutputBytes
backend.startConsoleData(loop: loop, maxSSEClients: options.maxSSEClients)
backend.outputBudget = server.outputBudget

// The one line tests and scripts wait for, written unbuffered.
let address = server.boundAddress
var ready = "pylon-backend listening on \(address)\n"
ready.withUTF8 { b in _ = write(1, b.baseAddress, b.count) }
log.info(
    "listening",
    [
        "address": address, "db": Store.redacted(options.dbPath), "maxBody": options.maxBody, "maxConnections": options.maxConnections,
        "idleTimeoutMs": options.timeouts.idleMs, "headerTimeoutMs": options.timeouts.headerMs,
        "bodyTimeoutMs": options.timeouts.bodyMs, "operatorAPI": backend.credentials.operatorToken != nil,
        "enrolment": options.openEnrolment ? "open" : (backend.credentials.enrolSecret != nil ? "secret" : "disabled"),
        "faultInjection": options.faultInjection, "dynsec": options.mqttDynsec,
        "nats": options.nats.map { $0.urls.joined(separator: ",") } ?? "off",
        "natsStream": options.nats?.stream.name ?? "-",
    ])

// SIGTERM / SIGINT: stop listening, close every connection, let the loop run dry, exit 0.
var signals: [SignalWatcher] = []
for sig in [SIGTERM, SIGINT] {
    signals.append(
        SignalWatcher(loop: loop, signal: sig) { s in
            log.info("stopping", ["signal": s])
            server.close()
            backend.mqtt?.stop()
            backend.jetstream?.stop()
            backend.stopConsoleData()
            for w in signals { w.close() }
        })
}
loop.run()
store.close()
log.info("stopped")
System.exit(0)
