import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// pylon-fleet: a fleet of simulated devices against pylon-backend and its brokers
/// (docs/FLEET.md, "Running a fleet").
var options: FleetOptions
do throws(FleetOptions.UsageError) {
    options = try FleetOptions.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    if error.description.isEmpty {
        print(FleetOptions.usage)
        System.exit(0)
    }
    Log.writeRaw("pylon-fleet: \(error.description)\n\(FleetOptions.usage)\n")
    System.exit(2)
}
System.unblockAllSignals()
System.ignoreSIGPIPE()
if options.runId.isEmpty { options.runId = "r" + System.randomHex(4) }

func secret(_ path: String?, _ what: String) -> String? {
    guard let path else { return nil }
    switch SecretFile.read(path) {
    case .success(let s): return String(decoding: s, as: UTF8.self)
    case .failure(let e):
        Log.writeRaw("pylon-fleet: cannot use the \(what) file: \(e.description)\n")
        System.exit(2)
    }
}
guard let enrol = secret(options.enrolSecretFile, "enrolment secret") else {
    Log.writeRaw("pylon-fleet: --enrol-secret-file is required (devices register with it)\n")
    System.exit(2)
}
let operatorToken = secret(options.operatorTokenFile, "operator token")
if operatorToken == nil { Log.writeRaw("pylon-fleet: no --operator-token-file: no pushes, nothing read back\n") }

// One descriptor per device (its MQTT connection) plus the HTTP connections: the soft limit is
// raised to the hard one (as root, the hard one to fs.nr_open first).
let fd = FDLimit.raise()
let capacity = FDLimit.deviceCapacity(limit: fd.limit, inflight: options.maxInflightHTTP)
var devices = options.devices
var fdNote: String?
if devices > capacity {
    fdNote = "RLIMIT_NOFILE \(fd.limit) (\(fd.note)) allows \(capacity) devices; \(options.devices) asked"
    Log.writeRaw("pylon-fleet: \(fdNote!): growth stops there\n")
    devices = capacity
}

let loop = Loop()
let fleet = Fleet(
    loop: loop, options: options, enrolSecret: enrol, operatorToken: operatorToken, devices: devices, fdNote: fdNote)
var exitCode: Int32 = 0
fleet.onDone = { code in
    exitCode = code
    loop.stop()
}
let sigint = SignalWatcher(loop: loop, signal: SIGINT) { _ in fleet.interrupt() }
let sigterm = SignalWatcher(loop: loop, signal: SIGTERM) { _ in fleet.interrupt() }
fleet.say(
    "\(devices) devices, \(options.ratePerDevice) events/s each, \(options.durationS) s, backend \(options.backend), brokers "
        + options.brokers.map { "\($0.host):\($0.port)" }.joined(separator: ",") + ", run \(options.runId), fd limit \(fd.limit)")
fleet.start()
loop.run()
sigint.close()
sigterm.close()
System.exit(exitCode)
