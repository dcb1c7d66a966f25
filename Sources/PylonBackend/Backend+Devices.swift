import PylonCore
import PylonStore

/// Device registration: `POST /v1/devices/register {installId}` issues the install's device
/// token, the one credential the device's plugins present (`Authorization: Bearer`) and the push
/// plugin's MQTT password (`Backend+Broker.swift`).
///
/// Who may register (docs/SECURITY.md, "Enrolment"):
/// - the enrolment secret (`--enrol-secret-file`): a new install only. An install already
///   registered is 409 `already_registered` (whoever read the secret from one device cannot
///   take another's identity), unless an operator approved it once
///   (`POST /v1/admin/devices/{installId}/reenrol`, for a device that lost its token);
/// - the install's own device token: a new secret for it (rotation; the old token stops
///   working);
/// - nothing, under `--open-enrolment`: a new install only, as with the secret.
///
/// Two requests registering one new install at once (on one instance or several) both get the
/// winner's registration (`Store.createDevice`): neither is a 500.
extension Backend {
    /// The MQTT client id the push plugin of an install connects with (bound to its credential).
    static func mqttClientId(installId: String) -> String { "pylon-push-" + installId }

    func registerDevice(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let install = body["installId"]?.stringValue, Backend.isValidInstallId(install) else {
            throw .badRequest(.invalidRequest, "installId must be 1 to 64 of [A-Za-z0-9._-]")
        }
        let now = System.wallClockMs()
        let existing = try storage { () throws(StoreError) in try store.deviceId(installId: install) }
        var id: String
        var secret = System.randomHex(32)
        var renewed = existing != nil
        switch principal {
        case .device(_, let own) where own != install:
            throw .forbidden("a device token registers its own install only")
        case .device(let own, _):
            id = own
            try storage { () throws(StoreError) in try store.renewDevice(id: own, secret: secret) }
        default:
            if let existing {
                var approved = false
                if case .enrolment = principal {
                    approved = try storage { () throws(StoreError) in try store.takeReenrolment(installId: install, now: now) }
                }
                guard approved else {
                    log.warn("enrolment of a registered install refused", ["installId": install])
                    throw APIError(
                        status: 409, code: .alreadyRegistered,
                        message:
                            "install \(install) is registered: renewing it needs its own device token, or an operator's approval "
                            + "(POST /v1/admin/devices/\(install)/reenrol); the enrolment secret registers new installs only")
                }
                id = existing
                try storage { () throws(StoreError) in try store.renewDevice(id: existing, secret: secret) }
                log.info("re-enrolment approved by an operator used", ["installId": install, "deviceId": existing])
            } else {
                let candidate = System.randomHex(8)
                var keyUsed = true
                let made: (deviceId: String, secret: String, created: Bool)
                do throws(APIError) {
                    made = try storage { () throws(StoreError) in
                        try store.transaction(.readCommitted) { () throws(StoreError) in
                            let made = try store.createDevice(id: candidate, installId: install, secret: secret, now: now)
                            // An enrolment key counts the device it registered, within its limit.
                            if made.created, case .enrolment(let key?) = principal {
                                keyUsed = try store.useEnrolmentKey(key, deviceId: made.deviceId, now: now)
                                if !keyUsed { throw StoreError.busy("the enrolment key may register no more devices") }
                            }
                            return made
                        }
                    }
                } catch {
                    guard keyUsed else {
                        throw .forbidden("this enrolment key may register no more devices (revoked, expired or at its maxDevices)")
                    }
                    throw error
                }
                (id, secret, renewed) = (made.deviceId, made.secret, false)
                if !made.created {
                    // Registered by a concurrent request: its answer, and the broker already has it.
                    log.info("device registered concurrently: answering the winner's registration", ["installId": install])
                    return try deviceAnswer(id: id, install: install, token: DeviceToken.make(deviceId: id, secret: secret), now: now)
                }
            }
        }
        let token = DeviceToken.make(deviceId: id, secret: secret)
        brokerAddDevice(deviceId: id, installId: install, password: token, renewed: renewed)
        log.info("device registered", ["deviceId": id, "renewed": renewed])
        return try deviceAnswer(id: id, install: install, token: token, now: now)
    }

    /// The registration's answer: device id, token and the broker settings.
    private func deviceAnswer(id: String, install: String, token: String, now: Int64) throws(APIError) -> HTTPResponse {
        var mqtt: JSONObject = [
            "username": .string(id), "clientId": .string(Backend.mqttClientId(installId: install)),
            "deviceTopic": .string(Backend.deviceTopic(id)), "ackTopic": .string(Backend.ackTopic(id)),
            "broadcastTopic": .string(Backend.broadcastTopic),
        ]
        // The pylon_auth plugin: a token the broker checks by its signature alone.
        if let auth = mqttAuth {
            mqtt["password"] = .string(
                auth.token(
                    username: id, clientId: Backend.mqttClientId(installId: install), nowS: now / 1000, validS: MQTTAuth.deviceTokenS))
        }
        // A nats-server cluster: the broker password is a user JWT for this device, not the token.
        if let auth = natsAuth {
            guard let jwt = auth.deviceJWT(deviceId: id, now: now) else {
                throw APIError(status: 500, code: .invalidRequest, message: "the device's broker credential could not be signed")
            }
            mqtt["password"] = .string(jwt)
        }
        return HTTPResponse(["deviceId": .string(id), "token": .string(token), "mqtt": .object(mqtt)])
    }

    /// `POST /v1/admin/devices/{installId}/reenrol` (operator): the enrolment secret may
    /// register this existing install once more, within `Limits.reenrolmentApprovalMs` — for a
    /// device that lost its token. 404 for an install never registered.
    func approveReenrolment(installId: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let expires = System.wallClockMs() + Limits.reenrolmentApprovalMs
        let known = try storage { () throws(StoreError) -> Bool in
            guard try store.deviceId(installId: installId) != nil else { return false }
            try store.approveReenrolment(installId: installId, by: principal.actor, expiresAt: expires)
            return true
        }
        guard known else { throw APIError(status: 404, code: .notFound, message: "no device with install id \(installId)") }
        audit(principal, "device.reenrol.approve", target: installId, detail: ["expiresAtMs": .int(expires)])
        return HTTPResponse(["installId": .string(installId), "expiresAtMs": .int(expires)])
    }

    /// What a device may write (docs/SECURITY.md, "Which streams a device writes"): a device
    /// token writes `ma.<appKey>` only for an AppKey that device declared (an MA call with its
    /// token, `noteDeviceApp`); every other stream, and the enrolment secret, as before.
    func checkDeviceWrite(stream: String, _ principal: Principal) throws(APIError) {
        guard case .device(let id, _) = principal, case let appKey = EventIndex.appKey(ofStream: stream), !appKey.isEmpty else { return }
        if deviceApps.contains(DeviceApp(deviceId: id, appKey: appKey)) { return }
        guard try storage({ () throws(StoreError) in try store.appRegistered(deviceId: id, appKey: appKey) }) else {
            throw APIError(
                status: 403, code: .appNotRegistered,
                message:
                    "stream \(stream) belongs to AppKey \(appKey), which this device has not registered "
                    + "(its MA plugin registers it with POST /v1/ma/\(appKey)/start)")
        }
        rememberDeviceApp(DeviceApp(deviceId: id, appKey: appKey))
    }

    /// An MA call made with a device token declares its AppKey on that device (once per
    /// instance: a bounded in-memory set avoids a write per call).
    func noteDeviceApp(appKey: String, _ principal: Principal) throws(APIError) {
        guard case .device(let id, _) = principal else { return }
        let key = DeviceApp(deviceId: id, appKey: appKey)
        if deviceApps.contains(key) { return }
        try storage { () throws(StoreError) in try store.registerApp(deviceId: id, appKey: appKey, now: System.wallClockMs()) }
        rememberDeviceApp(key)
    }

    private func rememberDeviceApp(_ key: DeviceApp) {
        if deviceApps.count >= Limits.maxRememberedDeviceApps { deviceApps.removeAll(keepingCapacity: true) }
        deviceApps.insert(key)
    }

    /// 1 to 64 of `[A-Za-z0-9._-]` (the MQTT client id is `pylon-push-` and the install id).
    static func isValidInstallId(_ s: String) -> Bool {
        (1...64).contains(s.utf8.count)
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x2E || c == 0x5F || c == 0x2D
            }
    }
}

extension Principal {
    /// The device a device token belongs to (nil for any other caller: the enrolment secret
    /// names no device).
    var deviceId: String? {
        if case .device(let id, _) = self { return id }
        return nil
    }
}

/// A device and an AppKey it declared.
struct DeviceApp: Hashable {
    var deviceId: String
    var appKey: String
}

extension APIError.Code {
    static let alreadyRegistered = APIError.Code(rawValue: "already_registered")
    static let appNotRegistered = APIError.Code(rawValue: "app_not_registered")
}
