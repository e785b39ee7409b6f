#!/usr/bin/env bash
# Makes what a Tally cluster needs for mTLS and bearer tokens, with openssl:
#   ca.pem, ca.key        the cluster's certificate authority
#   node.pem, node.key    one certificate for every program (server, shards,
#                         workers, the tally client): TLS server and client
#                         use, with the names and addresses below as SANs
#   tokens.txt            the token file for tally-server --tokens
#   admin.token worker.token viewer.token alice.token bob.token
#                         one token per file (--token_file): admin (the
#                         coordinator and shards), worker, viewer, and two
#                         submitters, alice and bob
# The SANs are localhost, 127.0.0.1, ::1, the compose service names, the
# Kubernetes service names (deploy/k8s: tally-server, tally-coordinator and
# the shards' *.tally-shard), and every extra NAME or IP given.
#   deploy/make-certs.sh DIR [--test-extras] [NAME|IP ...]
# --test-extras also makes, for the TLS tests, a certificate from another CA
# (stranger.pem/.key, stranger-ca.pem) and one of the cluster's CA that has
# expired (expired.pem/.key). Keys are 2048-bit RSA (EC works too); the
# certificates are valid for 825 days. Existing files in DIR are replaced.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR [--test-extras] [NAME|IP ...]}
shift
extras=0
sans="DNS:localhost,IP:127.0.0.1,IP:::1"
# docker-compose.yml and deploy/k8s service names.
for n in server shard1 shard2 worker1 worker2 submit tally-server \
         tally-coordinator tally-shard-0 tally-shard-1 tally-shard-2 tally-shard-3 \
         '*.tally-shard'; do
  sans+=",DNS:$n"
done
for a in "$@"; do
  case $a in
    --test-extras) extras=1 ;;
    *:*) sans+=",IP:$a" ;;        # IPv6
    *[!0-9.]*) sans+=",DNS:$a" ;;
    *) sans+=",IP:$a" ;;
  esac
done
mkdir -p "$dir"
cd "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ca() {  # name subject
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf_request() {  # name cn
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$2" \
    -keyout "$1.key" -out "$tmp/$1.csr" 2>/dev/null
  cat > "$tmp/$1.ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EXT
}
sign() {  # name ca
  openssl x509 -req -in "$tmp/$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -CAcreateserial -CAserial "$tmp/serial" -days 825 -sha256 \
    -extfile "$tmp/$1.ext" -out "$1.pem" 2>/dev/null
}

ca ca "Tally cluster CA"
leaf_request node tally-node
sign node ca

token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
rm -f tokens.txt
: > tokens.txt
for entry in "admin admin admin" "worker worker workers" "viewer viewer viewer" \
             "alice submitter alice" "bob submitter bob"; do
  read -r file role name <<< "$entry"
  t=$(token)
  rm -f "$file.token"  # a file made now gets the umask (owner only)
  echo "$t" > "$file.token"
  echo "$t $role $name" >> tokens.txt
done

if ((extras)); then
  ca stranger-ca "Some other CA"
  leaf_request stranger stranger
  sign stranger stranger-ca
  # Signed by the cluster's CA, valid only in 2001: `openssl ca` sets dates.
  leaf_request expired tally-node
  mkdir -p "$tmp/db"
  : > "$tmp/db/index.txt"
  cat > "$tmp/ca.cnf" <<CNF
[ca]
default_ca = old
[old]
database = $tmp/db/index.txt
new_certs_dir = $tmp/db
serial = $tmp/db/serial
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
CNF
  echo 01 > "$tmp/db/serial"
  openssl ca -batch -config "$tmp/ca.cnf" -cert ca.pem -keyfile ca.key \
    -startdate 20010101000000Z -enddate 20011231000000Z \
    -extfile "$tmp/expired.ext" -in "$tmp/expired.csr" -out expired.pem \
    -notext 2>/dev/null
fi
chmod 644 ./*.pem
echo "make-certs: CA, node certificate and tokens in $dir"
