# kubeadm init on the first control plane. The configuration (with the bootstrap token and, with several
# control planes, the certificate key) comes on stdin; a copy without them is kept for reference.
gk_secret_file {{ config }} {{ size }}
gk_kubeadm_lock
if [ -s /etc/kubernetes/admin.conf ]; then  # an interrupted run's kubeadm init finished meanwhile
  echo "@@gpuk8s-initialized-meanwhile"
  exit 0
fi
gk_to_the_end kubeadm-init kubeadm init --config {{ config }}{% if upload_certs %} --upload-certs{% endif %}
