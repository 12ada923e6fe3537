/// A lab CA made by the C code LabCA used before swift-certificates (CTLS's ctls_make_ca over
/// OpenSSL 3.0, commit 37ea9a8), as labs already have it on disk: ca.pem and ca-key.pem.
/// "HeraldLab old CA", valid 36500 days from 2026-11-27. Test material only: the key is public.
/// `leaf` is a certificate that same code issued with it (ctls_issue: common name "server",
/// names localhost, 127.0.0.1 and ::1, 30 days), to compare what the new code writes.
enum OldLabCA {
    static let certificate = """
-----BEGIN CERTIFICATE-----
MIIBojCCAUmgAwIBAgIQL6QKoFljCgrGDf20IrJGaDAKBggqhkjOPQQDAjAvMRIw
EAYDVQQKDAlIZXJhbGRMYWIxGTAXBgNVBAMMEEhlcmFsZExhYiBvbGQgQ0EwIBcN
MjYxMTI3MjAzMjA3WhgPMjEyNjExMDMyMTMyMDdaMC8xEjAQBgNVBAoMCUhlcmFs
ZExhYjEZMBcGA1UEAwwQSGVyYWxkTGFiIG9sZCBDQTBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABMdeLXOz4ve7GmtCZ/QEawr7ReGMN5L2P9Knts4GHex1sMQIYDWN
xhz/JzybGJB0f9jOWYkZkW6Dndwz/JSykJ2jRTBDMBIGA1UdEwEB/wQIMAYBAf8C
AQAwDgYDVR0PAQH/BAQDAgEGMB0GA1UdDgQWBBTyfzPBO9TTcvUEaXPyXIdc+ETU
oDAKBggqhkjOPQQDAgNHADBEAiBwNCRieqn1UoqsMN82coJjC7SUF67hBPfy9dSK
eIXlXwIgKH/U9ntEbFuf+KZkSiDBymHJunh/9InsNGmWurJpukM=
-----END CERTIFICATE-----
"""

    static let key = """
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgEvZHLChOR8Fd7/Vy
7SuIkfivAH3menxhpUOFB+74iDmhRANCAATHXi1zs+L3uxprQmf0BGsK+0XhjDeS
9j/Sp7bOBh3sdbDECGA1jcYc/yc8mxiQdH/YzlmJGZFug53cM/yUspCd
-----END PRIVATE KEY-----
"""

    static let leaf = """
-----BEGIN CERTIFICATE-----
MIIB4TCCAYigAwIBAgIQenKxTmTHRlI9eOHrUON88zAKBggqhkjOPQQDAjAvMRIw
EAYDVQQKDAlIZXJhbGRMYWIxGTAXBgNVBAMMEEhlcmFsZExhYiBvbGQgQ0EwHhcN
MjYxMTI3MjAzMjA3WhcNMjYxMjI3MjEzMjA3WjAlMRIwEAYDVQQKDAlIZXJhbGRM
YWIxDzANBgNVBAMMBnNlcnZlcjBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABIMy
IsCyQNunFjZZI8siGEwf9fx6ya6EOjqPAfcA2g0bZJFjXyYLnu9mmxeR9QQxoxyH
+eorwAlV0A7Z9kHrpqejgY8wgYwwDAYDVR0TAQH/BAIwADAOBgNVHQ8BAf8EBAMC
BaAwHQYDVR0lBBYwFAYIKwYBBQUHAwEGCCsGAQUFBwMCMB8GA1UdIwQYMBaAFPJ/
M8E71NNy9QRpc/Jch1z4RNSgMCwGA1UdEQQlMCOCCWxvY2FsaG9zdIcEfwAAAYcQ
AAAAAAAAAAAAAAAAAAAAATAKBggqhkjOPQQDAgNHADBEAiAbNh1i7VHbXp945IjS
ZZf2BI8m1x/y9SUoyE5KUjs3cQIgP7BBoIeUsooFAqx3aep7QjiUPJqZC7Tnwni4
ROWvfyA=
-----END CERTIFICATE-----
"""
}
